//! The attach protocol, written once for both sides: the controller
//! (`witch CRAFT --pid`, witchd) and the agent it loads into a running
//! process.
//!
//! 1. The controller stops one thread of the target with ptrace and makes
//!    it call [`ATTACH_SYMBOL`]`(int out[2])` in the agent, with its own
//!    pid in `out[0]` (or -1 if the target is in another pid namespace)
//!    and [`NO_ANSWER`] in `out[1]`. The agent checks it can run a session
//!    ([`AttachCode`]), creates a socket pair, starts its control thread on
//!    one end and stores the other end's number in `out[0]`, and its answer
//!    in `out[1]`. The answer goes through memory,
//!    not the return value: the call returns into the C library's signal
//!    return, which puts the thread back as it was even if the controller
//!    dies meanwhile, and which overwrites `rax` on its way.
//! 2. The controller copies that end into itself (`pidfd_getfd`, which
//!    needs the same right as ptrace), lets the thread go, and sends
//!    [`Message::Settings`]. The agent then closes its copy of the
//!    controller's end, so that either side going away is seen by the
//!    other as the end of the stream. Until then it holds that copy, so the
//!    stream cannot tell it that the controller died: it watches the
//!    controller's pid instead, and gives up at once when it exits, rather
//!    than refusing attaches as [`AttachCode::Busy`] for
//!    [`SETTINGS_WAIT`].
//! 3. The agent sets the process up and answers [`Message::Ready`] or
//!    [`Message::Error`]. [`Message::Detach`] from the controller, or the
//!    controller's end closing (it exited or gave up), ends the session:
//!    the agent undoes everything, sends [`Message::Profile`] if it has one
//!    and [`Message::Detached`]. A process that exits during a session
//!    sends its profile at exit.
//!
//! No file system path is shared: a root controller never opens anything
//! the target's owner could have planted (docs/SECURITY.md). Every message
//! is framed (kind, length, payload) and bounded per kind, so neither side
//! can make the other read without end.

/// The agent's entry point: `void witch_session_start(int out[2])`.
/// (Named for this protocol: an agent of an earlier one, still loaded in a
/// process, has no such symbol and is refused clearly.)
pub const ATTACH_SYMBOL: &str = "witch_session_start";

/// The name of the agent's control thread in the target (its `comm`).
pub const AGENT_THREAD: &str = "witch-agent";

/// How long the agent waits for the settings of a controller it cannot
/// watch (one in another pid namespace).
pub const SETTINGS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What `out[1]` holds before the call: an agent that never wrote it did
/// not run.
pub const NO_ANSWER: i32 = -1;

/// The agent's answers in `out[1]` (2, a bad argument, is no longer
/// given: the entry point cannot answer through a null pointer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum AttachCode {
    Ok = 0,
    /// A session is running in the process already.
    Busy = 1,
    /// The process runs under a preloaded agent.
    Preloaded = 3,
    /// The control thread could not be started.
    NoThread = 4,
    /// All of the calling thread's debug registers are taken.
    NoDebugRegisters = 5,
    /// The session's socket pair could not be created.
    NoChannel = 6,
    /// The controller had exited by the time the agent looked for it (it
    /// was killed during the call): nothing was started.
    ControllerGone = 7,
}

impl AttachCode {
    pub const ALL: [AttachCode; 7] = [
        AttachCode::Ok,
        AttachCode::Busy,
        AttachCode::Preloaded,
        AttachCode::NoThread,
        AttachCode::NoDebugRegisters,
        AttachCode::NoChannel,
        AttachCode::ControllerGone,
    ];

    /// The code the agent stored.
    pub fn from_raw(v: i32) -> Option<AttachCode> {
        Self::ALL.into_iter().find(|c| *c as i32 == v)
    }

    /// Why the process can't be profiled now, for the user.
    pub fn message(self) -> &'static str {
        match self {
            AttachCode::Ok => "ok",
            AttachCode::Busy => "a witch session is already running in it (another witch or witchd attached); try again later",
            AttachCode::Preloaded => "it already runs under a preloaded witch agent (started by `witch CRAFT ./prog`)",
            AttachCode::NoThread => "the agent could not start its control thread in it",
            AttachCode::NoDebugRegisters => "all of its debug registers are in use (is a debugger or another tool watching it?)",
            AttachCode::NoChannel => "the agent could not create its session socket in it (out of file descriptors?)",
            AttachCode::ControllerGone => "the agent found its controller gone (exited during the attach), and started nothing",
        }
    }
}

/// The longest settings text (a few hundred bytes in practice).
pub const MAX_SETTINGS: usize = 64 << 10;
/// The longest error or note line.
pub const MAX_LINE: usize = 4 << 10;
/// The largest profile a controller accepts.
pub const MAX_PROFILE: usize = 256 << 20;

/// One message of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Controller to agent, first: the settings as `WITCH_*` lines
    /// ([`crate::config::Config::to_lines`]).
    Settings(String),
    /// Agent: set up, with this many threads.
    Ready { threads: u32 },
    /// Agent: the session could not start (one line); it is over.
    Error(String),
    /// Controller: end the session.
    Detach,
    /// Agent: the session's profile (JSON, [`crate::profile::Profile`]).
    Profile(Vec<u8>),
    /// Agent: everything is undone; nothing more follows.
    Detached,
}

const SETTINGS: u8 = 1;
const READY: u8 = 2;
const ERROR: u8 = 3;
const DETACH: u8 = 4;
const PROFILE: u8 = 5;
const DETACHED: u8 = 6;

/// Kind byte and little-endian payload length.
const HEADER: usize = 5;

impl Message {
    /// The framed bytes.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload): (u8, &[u8]) = match self {
            Message::Settings(s) => (SETTINGS, s.as_bytes()),
            Message::Ready { threads } => return frame(READY, &threads.to_le_bytes()),
            Message::Error(s) => (ERROR, s.as_bytes()),
            Message::Detach => (DETACH, &[]),
            Message::Profile(p) => (PROFILE, p),
            Message::Detached => (DETACHED, &[]),
        };
        frame(kind, payload)
    }
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + payload.len());
    v.push(kind);
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// A stream of bytes that isn't this protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    UnknownKind(u8),
    TooLong { kind: u8, len: usize, max: usize },
    BadPayload(u8),
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtocolError::UnknownKind(k) => write!(f, "unknown message kind {k}"),
            ProtocolError::TooLong { kind, len, max } => write!(f, "message of kind {kind} is {len} bytes, more than the {max} allowed"),
            ProtocolError::BadPayload(k) => write!(f, "malformed message of kind {k}"),
        }
    }
}

impl std::error::Error for ProtocolError {}

fn max_len(kind: u8) -> Option<usize> {
    match kind {
        SETTINGS => Some(MAX_SETTINGS),
        READY => Some(4),
        ERROR => Some(MAX_LINE),
        DETACH | DETACHED => Some(0),
        PROFILE => Some(MAX_PROFILE),
        _ => None,
    }
}

/// Reassembles messages from bytes as they arrive. A length beyond the
/// kind's bound is an error before any of it is buffered.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes still needed before [`Decoder::next_message`] can return a message
    /// (at least 1), or an error if the header already says it's not ours.
    pub fn wanted(&self) -> Result<usize, ProtocolError> {
        if self.buf.len() < HEADER {
            return Ok(HEADER - self.buf.len());
        }
        let (kind, len) = self.header()?;
        let _ = kind;
        Ok((HEADER + len).saturating_sub(self.buf.len()).max(1))
    }

    fn header(&self) -> Result<(u8, usize), ProtocolError> {
        let kind = self.buf[0];
        let len = u32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        let max = max_len(kind).ok_or(ProtocolError::UnknownKind(kind))?;
        if len > max {
            return Err(ProtocolError::TooLong { kind, len, max });
        }
        Ok((kind, len))
    }

    /// The next complete message, if one has arrived.
    pub fn next_message(&mut self) -> Result<Option<Message>, ProtocolError> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let (kind, len) = self.header()?;
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let payload: Vec<u8> = self.buf.drain(..HEADER + len).skip(HEADER).collect();
        let text = |p: Vec<u8>| String::from_utf8(p).map_err(|_| ProtocolError::BadPayload(kind));
        Ok(Some(match kind {
            SETTINGS => Message::Settings(text(payload)?),
            READY => {
                let b: [u8; 4] = payload.as_slice().try_into().map_err(|_| ProtocolError::BadPayload(kind))?;
                Message::Ready { threads: u32::from_le_bytes(b) }
            }
            ERROR => Message::Error(text(payload)?),
            DETACH => Message::Detach,
            PROFILE => Message::Profile(payload),
            DETACHED => Message::Detached,
            k => return Err(ProtocolError::UnknownKind(k)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_framing_split_anywhere() {
        let msgs = vec![
            Message::Settings("WITCH_CRAFT=dead\n".into()),
            Message::Ready { threads: 7 },
            Message::Error("no free debug registers".into()),
            Message::Detach,
            Message::Profile(b"{\"schema\":1}".to_vec()),
            Message::Detached,
        ];
        let bytes: Vec<u8> = msgs.iter().flat_map(Message::encode).collect();
        for chunk in [1, 2, 3, 7, bytes.len()] {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for c in bytes.chunks(chunk) {
                assert!(d.wanted().unwrap() >= 1);
                d.push(c);
                while let Some(m) = d.next_message().unwrap() {
                    got.push(m);
                }
            }
            assert_eq!(got, msgs, "chunks of {chunk}");
        }
    }

    #[test]
    fn oversized_and_unknown_messages_are_refused_from_their_header() {
        let mut d = Decoder::default();
        d.push(&[ERROR, 0xff, 0xff, 0xff, 0x7f]);
        assert!(matches!(d.wanted(), Err(ProtocolError::TooLong { .. })));
        assert!(d.next_message().is_err());
        let mut d = Decoder::default();
        d.push(&[99, 0, 0, 0, 0]);
        assert_eq!(d.next_message(), Err(ProtocolError::UnknownKind(99)));
        let mut d = Decoder::default();
        d.push(&[READY, 3, 0, 0, 0, 1, 2, 3]);
        assert_eq!(d.next_message(), Err(ProtocolError::BadPayload(READY)));
    }

    #[test]
    fn codes_round_trip_and_say_something() {
        for c in AttachCode::ALL {
            assert_eq!(AttachCode::from_raw(c as i32), Some(c));
            assert!(!c.message().is_empty());
        }
        assert_eq!(AttachCode::from_raw(42), None);
        assert_eq!(AttachCode::from_raw(NO_ANSWER), None);
    }
}
