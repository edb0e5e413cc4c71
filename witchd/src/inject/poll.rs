//! One poll of a running session, for `witch --pid` and witchd's sessions
//! alike: should the session end now, before its time, and why? Each
//! caller polls at its own pace and keeps its own reaction (messages, exit
//! codes, counters); the questions, their order and what they mean are
//! here.
//!
//! A poll asks, cheapest first, and stops at the first answer:
//! - is the target still running? ([`Why::Exited`] if not)
//! - has it laid out a new image since the attach (an exec)? ([`Why::Exec`])
//! - has the agent ended the session by itself (a debugger attached, or
//!   the process is entering a seccomp sandbox)? ([`Why::AgentEnded`])
//! - has the agent's socket closed by itself? Then, once, is the agent gone
//!   from a process still running: an exec that kept the image's layout
//!   (address randomization off) ([`Why::Exec`]). A socket also closes when
//!   the process exits, its profile sent first: the next poll sees it gone.

/// Why a session ends before its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The target exited (or is exiting): its profile, if any, is its last.
    Exited,
    /// The target replaced its program (exec): the agent, and what it
    /// gathered, went with the old image; the process runs on.
    Exec,
    /// The agent ended the session by itself (a debugger attached, or the
    /// process is entering a seccomp sandbox): its profile waits for the
    /// detach, and the process runs on.
    AgentEnded,
}

/// What a poll reads of a session. [`super::Attachment`] reads the process;
/// witchd's tests fake it.
pub trait SessionFacts {
    /// Is the target still running (not a zombie)?
    fn target_alive(&self) -> bool;
    /// Has the process laid out a new image since the attach (an exec)?
    /// Cheap enough to poll.
    fn exec_seen(&self) -> bool;
    /// Has the agent ended the session by itself (a debugger attached to
    /// the process, or it is entering a seccomp sandbox)? Does not wait.
    fn agent_ended(&self) -> bool;
    /// Has the agent's end of the socket closed, by itself (without a
    /// detach)? Does not wait.
    fn agent_closed(&self) -> bool;
    /// Has the agent gone from the process with the program it was in?
    /// Reads the maps: too long to read at every poll.
    fn agent_gone(&self) -> bool;
}

/// The polls of one session: what an earlier poll saw, so that the maps
/// are read once, when the socket is first seen closed.
#[derive(Debug, Default)]
pub struct Poll {
    closed_seen: bool,
}

impl Poll {
    /// Why the session should end now; None: it goes on.
    pub fn why(&mut self, s: &(impl SessionFacts + ?Sized)) -> Option<Why> {
        if !s.target_alive() {
            return Some(Why::Exited);
        }
        if s.exec_seen() {
            return Some(Why::Exec);
        }
        if s.agent_ended() {
            return Some(Why::AgentEnded);
        }
        if !self.closed_seen && s.agent_closed() {
            self.closed_seen = true;
            // Asked again: an exiting process lets its memory go, and then
            // maps nothing (not taken for the agent gone), or still maps the
            // agent; either way it is no exec.
            if s.agent_gone() && s.target_alive() {
                return Some(Why::Exec);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A session's facts as set, counting how often the maps were read.
    #[derive(Default)]
    struct Facts {
        dead: bool,
        exec: bool,
        ended: bool,
        closed: bool,
        gone: bool,
        /// The process exits between the first question and the last.
        dies_after_first_ask: bool,
        asked_alive: Cell<u32>,
        maps_read: Cell<u32>,
    }

    impl SessionFacts for Facts {
        fn target_alive(&self) -> bool {
            let n = self.asked_alive.get();
            self.asked_alive.set(n + 1);
            !self.dead && (!self.dies_after_first_ask || n == 0)
        }
        fn exec_seen(&self) -> bool {
            self.exec
        }
        fn agent_ended(&self) -> bool {
            self.ended
        }
        fn agent_closed(&self) -> bool {
            self.closed
        }
        fn agent_gone(&self) -> bool {
            self.maps_read.set(self.maps_read.get() + 1);
            self.gone
        }
    }

    fn once(f: Facts) -> (Option<Why>, u32) {
        let why = Poll::default().why(&f);
        (why, f.maps_read.get())
    }

    #[test]
    fn each_fact_gives_its_reason_and_the_first_one_wins() {
        assert_eq!(once(Facts::default()), (None, 0));
        assert_eq!(
            once(Facts { dead: true, exec: true, ended: true, closed: true, gone: true, ..Default::default() }),
            (Some(Why::Exited), 0)
        );
        assert_eq!(once(Facts { exec: true, ended: true, closed: true, gone: true, ..Default::default() }), (Some(Why::Exec), 0));
        assert_eq!(once(Facts { ended: true, closed: true, gone: true, ..Default::default() }), (Some(Why::AgentEnded), 0));
        // The socket closed, the agent gone from a running process: an exec
        // that kept the layout.
        assert_eq!(once(Facts { closed: true, gone: true, ..Default::default() }), (Some(Why::Exec), 1));
        // Closed, the agent still mapped: not an exec (a process on its way
        // out; the next poll sees it gone).
        assert_eq!(once(Facts { closed: true, ..Default::default() }), (None, 1));
        // Closed and no agent in the maps, but the process died meanwhile:
        // not an exec.
        assert_eq!(once(Facts { closed: true, gone: true, dies_after_first_ask: true, ..Default::default() }), (None, 1));
        // Gone from the maps with the socket open is not asked about.
        assert_eq!(once(Facts { gone: true, ..Default::default() }), (None, 0));
    }

    #[test]
    fn the_maps_are_read_once_when_the_socket_is_first_seen_closed() {
        let f = Facts { closed: true, ..Default::default() };
        let mut poll = Poll::default();
        for _ in 0..5 {
            assert_eq!(poll.why(&f), None);
        }
        assert_eq!(f.maps_read.get(), 1);
        // The other questions are still asked at every poll.
        assert_eq!(poll.why(&Facts { ended: true, ..Default::default() }), Some(Why::AgentEnded));
        assert_eq!(poll.why(&Facts { exec: true, ..Default::default() }), Some(Why::Exec));
        assert_eq!(poll.why(&Facts { dead: true, ..Default::default() }), Some(Why::Exited));
        // A fresh session's polls read them again.
        assert_eq!(Poll::default().why(&f), None);
        assert_eq!(f.maps_read.get(), 2);
    }
}
