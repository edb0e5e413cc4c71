//! The text report's width: the terminal's, or 80 columns when it goes to
//! a file or pipe, and lines fitted to it at spaces, nothing cut.

/// Columns the report is fitted to when it goes to no terminal (a file, a
/// pipe, a CI log), and the least a terminal is taken to have.
pub const COLUMNS: usize = 80;

/// The width of the terminal the report is shown on (stderr's, else
/// stdout's, else `COLUMNS` of the environment), or [`COLUMNS`] when
/// neither is a terminal.
pub(super) fn terminal_width() -> usize {
    use std::io::IsTerminal;
    for (fd, term) in [(2, std::io::stderr().is_terminal()), (1, std::io::stdout().is_terminal())] {
        if !term {
            continue;
        }
        // SAFETY: TIOCGWINSZ only fills the winsize we pass.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on one of our standard descriptors.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col >= 40 {
            return ws.ws_col as usize;
        }
        return std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|&c| c >= 40).unwrap_or(COLUMNS);
    }
    COLUMNS
}

/// A line fitted to `width` columns: broken at spaces, each continuation
/// indented four columns past the line's own indent. Nothing is cut: a
/// word longer than the width (a C++ name) keeps a line of its own.
pub(super) fn fit(s: &str, width: usize) -> Vec<String> {
    if s.chars().count() <= width {
        return vec![s.to_string()];
    }
    let indent = s.chars().take_while(|&c| c == ' ').count();
    let cont = " ".repeat((indent + 4).min(width / 2));
    let mut out: Vec<String> = Vec::new();
    let mut cur = " ".repeat(indent);
    let mut cur_len = indent;
    let mut fresh = true;
    for word in s[indent..].split(' ') {
        let n = word.chars().count();
        if !fresh && cur_len + 1 + n > width {
            out.push(std::mem::replace(&mut cur, cont.clone()));
            cur_len = cont.len();
            fresh = true;
        }
        if !fresh {
            cur.push(' ');
            cur_len += 1;
        }
        cur.push_str(word);
        cur_len += n;
        fresh = false;
    }
    out.push(cur);
    out
}
