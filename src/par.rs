//! One parallel map for the whole workspace: the commands, the benchmarks and the corpus
//! builder all evaluate many candidates a few at a time through a kernel environment (whose
//! calls block on worker processes), and all of them do it with [`par_map`].
//!
//! Scoped threads, no pool: each call starts at most `threads` threads that take items in
//! order from a shared counter until none are left, so a slow item never holds up the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Applies `f` to every item on up to `threads` threads (at least one, never more than there
/// are items), items taken in order by whichever thread is free. After each item,
/// `done(finished, item, &result)` is called on the thread that computed it, `finished` being
/// how many items are done so far (1, 2, ... in completion order): the place for a progress
/// line. The results come back in the order of `items`, whatever the completion order.
///
/// A panic in `f` or `done` propagates to the caller once every thread has stopped.
pub fn par_map<T, R, F, D>(items: &[T], threads: usize, f: F, done: D) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
    D: Fn(usize, &T, &R) + Sync,
{
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                done(finished.fetch_add(1, Ordering::SeqCst) + 1, item, &r);
                slots.lock().expect("results")[i] = Some(r);
            });
        }
    });
    slots
        .into_inner()
        .expect("results")
        .into_iter()
        .map(|r| r.expect("every item was mapped"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn results_keep_the_order_of_the_items_and_done_counts_every_item() {
        let items: Vec<u64> = (0..50).collect();
        let calls = AtomicUsize::new(0);
        let seen = Mutex::new(Vec::new());
        let out = par_map(
            &items,
            4,
            |&x| {
                // Later items finish first, so completion order differs from item order.
                std::thread::sleep(Duration::from_micros(50 * (50 - x)));
                x * x
            },
            |n, &x, &r| {
                assert_eq!(r, x * x);
                calls.fetch_add(1, Ordering::SeqCst);
                seen.lock().unwrap().push(n);
            },
        );
        assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert_eq!(calls.load(Ordering::SeqCst), 50);
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, (1..=50).collect::<Vec<_>>());
    }

    #[test]
    fn no_items_and_zero_threads_are_fine() {
        let none: Vec<u8> = par_map(&[] as &[u8], 8, |&x| x, |_, _, _| {});
        assert!(none.is_empty());
        assert_eq!(
            par_map(&[1, 2, 3], 0, |&x| x + 1, |_, _, _| {}),
            vec![2, 3, 4]
        );
    }
}
