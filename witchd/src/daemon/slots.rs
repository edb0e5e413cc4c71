//! Sharing the `max_sessions` session slots between the watch rules and
//! the users who ask for sessions (`witch daemon profile`).
//!
//! Sessions wait for a slot in one queue, and each slot that frees goes:
//! - to the oldest waiting session of a rule, if there is one: the
//!   schedule goes first;
//! - else to a waiting request, the one whose user holds the fewest slots
//!   (the oldest among equals), unless requests hold all the slots they
//!   may: every slot but one when there are rules (and more than one
//!   slot), so a rule's session never waits for a request to end.
//!
//! One user may have at most `max_user_sessions` requests in flight
//! (waiting or running); more are refused at once. Root is a user like any
//! other here: its rules are the schedule's.

use std::collections::{HashMap, VecDeque};

/// Whose session a slot is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// A `[[watch]]` rule's scheduled session.
    Rule,
    /// A session asked for by this uid.
    User(u32),
}

/// A place in the queue (or a slot held), for [`SessionSlots::granted`] and [`SessionSlots::release`].
pub type Ticket = u64;

/// The daemon's `max_sessions` session slots and the queue for them.
pub struct SessionSlots {
    max: usize,
    /// Slots requests may hold at once.
    for_requests: usize,
    per_user: usize,
    running: Vec<(Ticket, Who)>,
    waiting: VecDeque<(Ticket, Who)>,
    /// Requests admitted and not yet ended, per uid.
    in_flight: HashMap<u32, usize>,
    next: Ticket,
}

impl SessionSlots {
    /// `max` slots; `rules`: whether any `[[watch]]` rule is configured;
    /// `per_user`: requests one user may have in flight.
    pub fn new(max: usize, rules: bool, per_user: usize) -> SessionSlots {
        let max = max.max(1);
        let for_requests = if rules && max > 1 { max - 1 } else { max };
        SessionSlots {
            max,
            for_requests,
            per_user: per_user.max(1),
            running: Vec::new(),
            waiting: VecDeque::new(),
            in_flight: HashMap::new(),
            next: 0,
        }
    }

    /// Slots requests may hold at once.
    pub fn for_requests(&self) -> usize {
        self.for_requests
    }

    /// A request of `uid` comes in: Err(how many it has in flight) when
    /// that is already `max_user_sessions`. Each Ok is ended by [`SessionSlots::done`].
    pub fn admit(&mut self, uid: u32) -> Result<(), usize> {
        let n = self.in_flight.entry(uid).or_insert(0);
        if *n >= self.per_user {
            return Err(*n);
        }
        *n += 1;
        Ok(())
    }

    /// An admitted request of `uid` ended (answered, failed or refused later).
    pub fn done(&mut self, uid: u32) {
        if let Some(n) = self.in_flight.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&uid);
            }
        }
    }

    /// Joins the queue for a slot; it may be granted at once.
    pub fn wait(&mut self, who: Who) -> Ticket {
        let t = self.next;
        self.next += 1;
        self.waiting.push_back((t, who));
        self.assign();
        t
    }

    /// Does `t` hold a slot?
    pub fn granted(&self, t: Ticket) -> bool {
        self.running.iter().any(|(r, _)| *r == t)
    }

    /// Gives up a slot, or a place in the queue; returns whether slots
    /// were handed on (waiters should look again).
    pub fn release(&mut self, t: Ticket) -> bool {
        self.running.retain(|(r, _)| *r != t);
        self.waiting.retain(|(w, _)| *w != t);
        self.assign()
    }

    /// Sessions holding a slot and waiting for one.
    pub fn counts(&self) -> (usize, usize) {
        (self.running.len(), self.waiting.len())
    }

    fn held_by(&self, uid: u32) -> usize {
        self.running.iter().filter(|(_, w)| *w == Who::User(uid)).count()
    }

    /// Hands free slots to waiters, as the module comment says.
    fn assign(&mut self) -> bool {
        let mut any = false;
        while self.running.len() < self.max {
            let rule = self.waiting.iter().position(|(_, w)| *w == Who::Rule);
            let requests = self.running.iter().filter(|(_, w)| *w != Who::Rule).count();
            let request = (requests < self.for_requests)
                .then(|| {
                    self.waiting
                        .iter()
                        .enumerate()
                        .filter_map(|(i, (_, w))| match w {
                            Who::User(u) => Some((self.held_by(*u), i)),
                            Who::Rule => None,
                        })
                        .min()
                        .map(|(_, i)| i)
                })
                .flatten();
            let Some(i) = rule.or(request) else { break };
            let w = self.waiting.remove(i).expect("in the queue");
            self.running.push(w);
            any = true;
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Six requests of one user hold no more than their share, and a rule's
    /// session due meanwhile gets a slot at once.
    #[test]
    fn one_user_never_starves_the_rules() {
        let mut s = SessionSlots::new(2, true, 2);
        assert_eq!(s.admit(1000), Ok(()));
        assert_eq!(s.admit(1000), Ok(()));
        for _ in 0..4 {
            assert_eq!(s.admit(1000), Err(2), "beyond max_user_sessions: refused");
        }
        let a = s.wait(Who::User(1000));
        let b = s.wait(Who::User(1000));
        assert!(s.granted(a));
        assert!(!s.granted(b), "requests may not take the rules' last slot");
        let r = s.wait(Who::Rule);
        assert!(s.granted(r), "the rule's session starts at once");
        s.release(r);
        assert!(!s.granted(b), "the slot a rule frees is still the rules'");
        s.release(a);
        s.done(1000);
        assert!(s.granted(b));
        assert_eq!(s.admit(1000), Ok(()), "a request that ended makes room for another");
    }

    /// The schedule goes first; requests share by who holds fewer slots.
    #[test]
    fn rules_first_then_the_user_holding_fewest() {
        let mut s = SessionSlots::new(3, true, 5);
        let held = [s.wait(Who::User(1)), s.wait(Who::User(1))];
        assert!(held.iter().all(|t| s.granted(*t)));
        let one_more = s.wait(Who::User(1));
        let other = s.wait(Who::User(2));
        let rule = s.wait(Who::Rule);
        assert!(s.granted(rule), "the last slot is the rule's");
        assert!(!s.granted(one_more) && !s.granted(other));
        s.release(held[0]);
        assert!(s.granted(other), "user 2 holds none, user 1 holds one: user 2 goes first");
        assert!(!s.granted(one_more));
        // Without rules, requests may hold every slot.
        let mut s = SessionSlots::new(2, false, 5);
        let (a, b) = (s.wait(Who::User(1)), s.wait(Who::User(1)));
        assert!(s.granted(a) && s.granted(b));
        // With one slot, a request may hold it; a rule waiting goes next.
        let mut s = SessionSlots::new(1, true, 5);
        let a = s.wait(Who::User(1));
        let (r, b) = (s.wait(Who::Rule), s.wait(Who::User(2)));
        assert!(s.granted(a));
        s.release(a);
        assert!(s.granted(r) && !s.granted(b));
        // Leaving the queue unasked hands nothing on wrongly.
        s.release(b);
        assert_eq!(s.counts(), (1, 0));
    }
}
