//! Which slot runs which request. A request arriving while slots are idle goes to the idle slot
//! whose last prompt it continues (the same conversation's earlier turn: its KV cache is reused);
//! otherwise to the idle slot unused the longest, so that one conversation does not evict
//! another that shares only a system prompt with it. When
//! every slot is busy, requests wait in one bounded first-in-first-out queue (full: refused at
//! once) and the next free slot takes the oldest.

use parking_lot::{Condvar, Mutex};
use pi2_model::TokenId;
use std::collections::VecDeque;

struct SlotState<J> {
    busy: bool,
    /// A job handed to this slot while it was idle.
    mailbox: Option<J>,
    /// Jobs for this slot only (its KV cache saved, restored or erased), taken before the
    /// shared queue.
    own: VecDeque<J>,
    /// The tokens the slot's KV cache held after its last job.
    cached: Vec<TokenId>,
    /// Length of its last job's prompt.
    prompt_len: usize,
    /// When it last took a job (a counter; 0 = never).
    last_used: u64,
}

struct State<J> {
    /// Waiting jobs with their prompts' lengths.
    queue: VecDeque<(J, usize)>,
    slots: Vec<SlotState<J>>,
    clock: u64,
}

/// Jobs that may wait for one slot.
pub(crate) const OWN_JOBS: usize = 4;

/// The hand-off between the HTTP side and the slots.
pub struct Scheduler<J> {
    state: Mutex<State<J>>,
    wake: Condvar,
    capacity: usize,
}

/// Where a submitted job went.
#[derive(Debug, PartialEq, Eq)]
pub enum Placed {
    /// Straight to this idle slot.
    Slot(usize),
    /// Into the queue, this many jobs now waiting.
    Queued(usize),
}

impl<J> Scheduler<J> {
    /// `slots` slots behind a queue of `capacity` jobs.
    pub fn new(slots: usize, capacity: usize) -> Self {
        let slots = (0..slots)
            .map(|_| SlotState {
                busy: false,
                mailbox: None,
                own: VecDeque::new(),
                cached: Vec::new(),
                prompt_len: 0,
                last_used: 0,
            })
            .collect();
        Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                slots,
                clock: 0,
            }),
            wake: Condvar::new(),
            capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Places `job` (whose prompt is `prompt`), or gives it back if the queue is full.
    pub fn submit(&self, job: J, prompt: &[TokenId]) -> Result<Placed, J> {
        let mut st = self.state.lock();
        let common = |c: &[TokenId]| c.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let idle = st
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.busy && s.mailbox.is_none() && s.own.is_empty());
        // Continues the slot's last prompt (all of it but perhaps its last token, which
        // generation may not have kept).
        let similar = idle
            .clone()
            .map(|(i, s)| (i, common(&s.cached), s.prompt_len))
            .filter(|&(_, c, last)| c > 0 && c + 1 >= last)
            .max_by_key(|&(i, c, _)| (c, std::cmp::Reverse(i)))
            .map(|(i, _, _)| i);
        let least_recent = idle.min_by_key(|(i, s)| (s.last_used, *i)).map(|(i, _)| i);
        let placed = match similar.or(least_recent) {
            Some(i) => {
                st.clock += 1;
                let clock = st.clock;
                let s = &mut st.slots[i];
                (s.busy, s.mailbox, s.last_used) = (true, Some(job), clock);
                s.prompt_len = prompt.len();
                Placed::Slot(i)
            }
            None if st.queue.len() < self.capacity => {
                st.queue.push_back((job, prompt.len()));
                Placed::Queued(st.queue.len())
            }
            None => return Err(job),
        };
        drop(st);
        self.wake.notify_all();
        Ok(placed)
    }

    /// Hands `job` to slot `id` itself (after what it is doing and what was handed to it
    /// before), or gives it back when `OWN_JOBS` already wait for that slot.
    pub fn submit_to(&self, id: usize, job: J) -> Result<(), J> {
        let mut st = self.state.lock();
        let Some(slot) = st.slots.get_mut(id) else {
            return Err(job);
        };
        if slot.own.len() >= OWN_JOBS {
            return Err(job);
        }
        slot.own.push_back(job);
        drop(st);
        self.wake.notify_all();
        Ok(())
    }

    /// Slot `id` is done with its job and its KV cache holds `cached` (for routing prompts and
    /// `/slots`).
    pub fn job_done(&self, id: usize, cached: &[TokenId]) {
        let mut st = self.state.lock();
        st.slots[id].busy = false;
        st.slots[id].cached.clear();
        st.slots[id].cached.extend_from_slice(cached);
    }

    /// Slot `id`'s next job (waiting for one); `cached` is what the slot's KV cache holds now.
    pub fn next(&self, id: usize, cached: &[TokenId]) -> J {
        self.job_done(id, cached);
        let mut st = self.state.lock();
        loop {
            if let Some(job) = st.slots[id].mailbox.take() {
                return job;
            }
            if let Some(job) = st.slots[id].own.pop_front() {
                st.slots[id].busy = true;
                return job;
            }
            if let Some((job, prompt_len)) = st.queue.pop_front() {
                st.clock += 1;
                let clock = st.clock;
                let s = &mut st.slots[id];
                (s.busy, s.last_used, s.prompt_len) = (true, clock, prompt_len);
                return job;
            }
            st.slots[id].busy = false;
            self.wake.wait(&mut st);
        }
    }

    /// Jobs waiting in the queue.
    pub fn queued(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Each slot's state now: busy, and the tokens its KV cache held after its last job.
    pub fn slots(&self) -> Vec<SlotView> {
        let st = self.state.lock();
        (st.slots.iter())
            .map(|s| SlotView {
                busy: s.busy || s.mailbox.is_some() || !s.own.is_empty(),
                cached_tokens: s.cached.len(),
            })
            .collect()
    }
}

/// What `GET /slots` shows of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotView {
    pub busy: bool,
    pub cached_tokens: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheduler whose slots hold these tokens (those holding some used once, in order)
    /// and are idle.
    fn with_slots(cached: &[&[TokenId]], capacity: usize) -> Scheduler<u32> {
        let s = Scheduler::new(cached.len(), capacity);
        {
            let mut st = s.state.lock();
            for (i, (slot, c)) in st.slots.iter_mut().zip(cached).enumerate() {
                slot.cached = c.to_vec();
                slot.prompt_len = c.len().saturating_sub(2);
                slot.last_used = if c.is_empty() { 0 } else { i as u64 + 1 };
            }
            st.clock = cached.len() as u64;
        }
        s
    }

    #[test]
    fn a_conversation_returns_to_its_slot_and_another_takes_the_free_one() {
        let s = with_slots(&[&[1, 2, 3, 4, 5, 6], &[]], 4);
        // Continues slot 0's conversation.
        assert_eq!(s.submit(10, &[1, 2, 3, 4, 5, 6, 7]), Ok(Placed::Slot(0)));
        let s = with_slots(&[&[1, 2, 3, 4, 5, 6], &[]], 4);
        // Shares only a system prompt (its first 2 of 4 prompt tokens): the unused slot.
        assert_eq!(s.submit(11, &[1, 2, 9, 9]), Ok(Placed::Slot(1)));
        // Both busy now that slot 0 takes the next one; then the queue, then refusal.
        assert_eq!(s.submit(12, &[5]), Ok(Placed::Slot(0)));
        assert_eq!(s.submit(13, &[5]), Ok(Placed::Queued(1)));
        for j in 14..17 {
            assert!(matches!(s.submit(j, &[5]), Ok(Placed::Queued(_))));
        }
        assert_eq!(s.submit(17, &[5]), Err(17));
    }

    #[test]
    fn a_job_for_one_slot_waits_for_it_and_comes_before_the_queue() {
        let s = Scheduler::new(2, 8);
        assert_eq!(s.submit(1, &[1]), Ok(Placed::Slot(0)));
        assert_eq!(s.submit(2, &[2]), Ok(Placed::Slot(1)));
        assert_eq!(s.submit(3, &[3]), Ok(Placed::Queued(1)));
        assert_eq!(s.submit_to(0, 9), Ok(()));
        assert_eq!(s.submit_to(5, 9), Err(9), "no such slot");
        assert_eq!((s.next(0, &[]), s.next(1, &[])), (1, 2));
        // Slot 1 finishing takes the queue, never slot 0's own job.
        assert_eq!(s.next(1, &[]), 3);
        assert_eq!(s.next(0, &[]), 9);
        for j in 0..OWN_JOBS as u32 {
            assert_eq!(s.submit_to(1, j), Ok(()));
        }
        assert_eq!(s.submit_to(1, 99), Err(99), "at most OWN_JOBS wait");
    }

    #[test]
    fn free_slots_take_their_mailbox_then_the_oldest_queued_job() {
        let s = std::sync::Arc::new(Scheduler::new(1, 8));
        assert_eq!(s.submit(1, &[1]), Ok(Placed::Slot(0)));
        assert_eq!(s.submit(2, &[2]), Ok(Placed::Queued(1)));
        assert_eq!(s.submit(3, &[3]), Ok(Placed::Queued(2)));
        assert_eq!(s.next(0, &[]), 1);
        assert_eq!(s.next(0, &[1]), 2);
        assert_eq!(s.next(0, &[2]), 3);
        // An idle slot waits, and wakes for the next job.
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.next(0, &[3]));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(s.submit(4, &[4]), Ok(Placed::Slot(0)));
        assert_eq!(t.join().unwrap(), 4);
    }
}
