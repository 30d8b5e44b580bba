//! Bounded mailboxes with real backpressure, made explicit.
//!
//! Every actor's mailbox has a fixed number of credits. A sender takes a credit ([`Ticket`])
//! before it sends, waiting asynchronously when none is left: that wait is the backpressure. The
//! ticket travels inside the message and is dropped when the receiver is done with the message
//! (for the compile/verify/profile stages: when the work is done and its result handed on), which
//! returns the credit. Depth and high-water mark are exact, and the high-water mark goes into
//! metrics.jsonl and the trace.
//!
//! Why not actix's own bounded mailbox: a full actix mailbox parks the sending `Addr` clone and
//! re-polls without registering a waker in some paths (actix issues #120 and #534 report senders
//! that stall), and it exposes no depth. Actors here set actix's capacity above their credit count,
//! so actix itself never parks a sender.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The credit a message holds while it is queued or being worked on.
#[derive(Debug)]
pub struct Ticket {
    _permit: OwnedSemaphorePermit,
}

/// One actor's credit counter.
#[derive(Debug)]
pub struct Mailbox {
    name: &'static str,
    capacity: usize,
    credits: Arc<Semaphore>,
    high_water: AtomicUsize,
}

impl Mailbox {
    /// A mailbox of `capacity` credits for the actor `name`.
    pub fn new(name: &'static str, capacity: usize) -> Arc<Mailbox> {
        Arc::new(Mailbox {
            name,
            capacity,
            credits: Arc::new(Semaphore::new(capacity)),
            high_water: AtomicUsize::new(0),
        })
    }

    /// The actor's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Credits.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Messages queued or in progress now.
    pub fn depth(&self) -> usize {
        self.capacity - self.credits.available_permits()
    }

    /// The largest depth seen.
    pub fn high_water(&self) -> usize {
        self.high_water.load(Ordering::Relaxed)
    }

    /// Waits for a credit.
    pub async fn ticket(&self) -> Ticket {
        let permit = self
            .credits
            .clone()
            .acquire_owned()
            .await
            .expect("mailbox semaphores are never closed");
        let depth = self.depth();
        if self.high_water.fetch_max(depth, Ordering::Relaxed) < depth {
            kevin::telemetry::counter(
                &format!("{}{}", kevin::telemetry::MAILBOX_COUNTER_PREFIX, self.name),
                depth as f64,
            );
        }
        Ticket { _permit: permit }
    }
}

/// A cheap handle to an actor: its address and its mailbox credits.
pub struct Handle<A: Actor> {
    /// The actix address.
    pub addr: Addr<A>,
    /// The credits.
    pub mailbox: Arc<Mailbox>,
}

impl<A: Actor> Clone for Handle<A> {
    fn clone(&self) -> Self {
        Handle {
            addr: self.addr.clone(),
            mailbox: self.mailbox.clone(),
        }
    }
}

impl<A: Actor> Handle<A> {
    /// Takes a credit (waiting while the mailbox is full), then sends the message built from it.
    /// Fails only when the actor is gone.
    pub async fn send<M>(&self, make: impl FnOnce(Ticket) -> M) -> Result<M::Result, MailboxError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<M>,
        A::Context: ToEnvelope<A, M>,
    {
        let ticket = self.mailbox.ticket().await;
        self.addr.send(make(ticket)).await
    }
}

/// actix's own capacity for an actor whose credits are `credits`: above it, so actix never parks.
pub fn actix_capacity(credits: usize) -> usize {
    credits * 2 + 64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn credits_bound_the_depth_and_record_the_high_water_mark() {
        let m = Mailbox::new("Test", 2);
        let a = m.ticket().await;
        let b = m.ticket().await;
        assert_eq!(m.depth(), 2);
        // A third sender waits until a credit comes back.
        let m2 = m.clone();
        let waiter = tokio::spawn(async move { m2.ticket().await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(a);
        let c = waiter.await.unwrap();
        assert_eq!(m.depth(), 2);
        drop((b, c));
        assert_eq!(m.depth(), 0);
        assert_eq!(m.high_water(), 2);
    }
}
