//! Waiting for a future on a thread that may block: how the synchronous API runs the
//! code it shares with the asynchronous one ([`crate::Guard::admit_async`], the etcd
//! store's calls), without a runtime of its own.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

/// Run `future` to its end on this thread, parking it while the future waits.
///
/// A future that is ready at once (the guard over a store that never waits) costs one
/// poll and nothing else. One that waits is woken by whoever it waits on: another
/// thread's runtime (etcd's connection), or another caller (a shared confirm).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    if let Poll::Ready(out) = future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        return out;
    }
    // Polled again with a waker that unparks this thread before it parks, so a wake
    // that came after the first poll is not lost.
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => std::thread::park(),
        }
    }
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_future_and_one_woken_by_another_thread_both_finish() {
        assert_eq!(block_on(async { 7 }), 7);
        let (tx, rx) = std::sync::mpsc::channel::<Waker>();
        let waker_thread = std::thread::spawn(move || {
            let waker = rx.recv().unwrap();
            waker.wake();
        });
        let mut sent = Some(tx);
        let mut polls = 0;
        let out = block_on(std::future::poll_fn(|cx| {
            polls += 1;
            match sent.take() {
                // The first poll (the noop waker) and the second (the real one) pend;
                // the other thread wakes the second.
                Some(tx) if polls == 2 => {
                    tx.send(cx.waker().clone()).unwrap();
                    Poll::Pending
                }
                Some(tx) => {
                    sent = Some(tx);
                    Poll::Pending
                }
                None => Poll::Ready("woken"),
            }
        }));
        waker_thread.join().unwrap();
        assert_eq!(out, "woken");
    }
}
