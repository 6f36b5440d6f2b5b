//! A panicking action's report on stderr, scrubbed of its job's secrets.
//!
//! The worker records a panicking action's message with the job's secrets
//! masked, but Rust's panic hook prints the raw message to stderr first,
//! where a careless handler's `panic!("… {token}")` would reach the
//! service's log. While an action's future is polled, its thread knows how
//! to scrub that job's text ([`Scrubbed`]); the hook installed by
//! [`install_hook`] prints a panic raised there scrubbed, and hands every
//! other panic to the hook that was in place before.
//!
//! A task an action spawns itself runs elsewhere and is not covered; its
//! panic does not fail the job either.

use std::backtrace::{Backtrace, BacktraceStatus};
use std::cell::RefCell;
use std::future::Future;
use std::panic::{self, PanicHookInfo};
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::task::{Context, Poll};

/// What masks one job's secrets in a text.
pub type Scrubber = Arc<dyn Fn(String) -> String + Send + Sync>;

thread_local! {
    /// The scrubber of the action being polled on this thread, if any.
    static POLLING: RefCell<Option<Scrubber>> = const { RefCell::new(None) };
}

/// Installs the hook, once per process; later calls do nothing.
pub fn install_hook() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            match POLLING.with(|polling| polling.borrow().clone()) {
                Some(scrub) => report_scrubbed(info, &scrub),
                None => previous(info),
            }
        }));
    });
}

/// The default hook's report, with the message scrubbed.
fn report_scrubbed(info: &PanicHookInfo<'_>, scrub: &Scrubber) {
    let message = info
        .payload()
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "Box<dyn Any>".to_string());
    let thread = std::thread::current();
    let location = info
        .location()
        .map(|at| format!(" at {at}"))
        .unwrap_or_default();
    let backtrace = Backtrace::capture();
    let backtrace = match backtrace.status() {
        BacktraceStatus::Captured => format!("\nstack backtrace:\n{backtrace}"),
        _ => String::new(),
    };
    eprintln!(
        "\nthread '{}' panicked{location}:\n{}{backtrace}",
        thread.name().unwrap_or("<unnamed>"),
        scrub(message),
    );
}

/// `future`, whose panics are reported through `scrub`.
pub fn scrubbed<F: Future>(future: F, scrub: Scrubber) -> Scrubbed<F> {
    Scrubbed {
        future: Box::pin(future),
        scrub,
    }
}

/// A future whose thread, while it is polled, scrubs a panic's report.
pub struct Scrubbed<F> {
    future: Pin<Box<F>>,
    scrub: Scrubber,
}

impl<F: Future> Future for Scrubbed<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        /// Puts back the thread's previous scrubber, also while a panic
        /// unwinds through the poll.
        struct Restore(Option<Scrubber>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let previous = self.0.take();
                POLLING.with(|polling| *polling.borrow_mut() = previous);
            }
        }
        let scrub = self.scrub.clone();
        let _restore = Restore(POLLING.with(|polling| polling.borrow_mut().replace(scrub)));
        self.future.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polling() -> Option<String> {
        POLLING
            .with(|polling| polling.borrow().clone())
            .map(|scrub| scrub("a s3cret".into()))
    }

    #[tokio::test]
    async fn the_scrubber_is_set_only_while_the_future_is_polled() {
        let scrub: Scrubber = Arc::new(|text: String| text.replace("s3cret", "***"));
        let during = scrubbed(
            async {
                let first = polling();
                tokio::task::yield_now().await;
                (first, polling())
            },
            scrub,
        )
        .await;
        assert_eq!(during, (Some("a ***".into()), Some("a ***".into())));
        assert_eq!(polling(), None);
    }

    #[tokio::test]
    async fn a_panic_unwinding_out_of_the_poll_clears_the_scrubber() {
        let scrub: Scrubber = Arc::new(|text: String| text);
        let outcome = tokio::spawn(scrubbed(async { panic!("boom") }, scrub)).await;
        assert!(outcome.is_err_and(|e| e.is_panic()));
        assert_eq!(polling(), None, "the task ran on this thread");
    }
}
