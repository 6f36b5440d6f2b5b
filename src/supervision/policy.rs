//! The restart policy of DESIGN.md §1, as a pure function of failure times.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::directory::ActorKind;
use crate::model::Millis;

/// What to do about a child that just failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartDecision {
    /// Respawn after `delay`; `restarts_in_window` counts this one too.
    Restart {
        delay: Duration,
        restarts_in_window: usize,
    },
    /// Too many failures in the window: stop the process so systemd or
    /// Kubernetes restarts it from a clean slate.
    Escalate { failures_in_window: usize },
}

const BASE_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Exponential backoff: 100 ms, 200 ms, 400 ms … capped at 10 s.
pub fn backoff(attempt: u32) -> Duration {
    BASE_BACKOFF
        .saturating_mul(2u32.saturating_pow(attempt.min(16)))
        .min(MAX_BACKOFF)
}

#[derive(Debug, Clone)]
pub struct RestartPolicy {
    max_restarts: usize,
    window_ms: Millis,
    failures: HashMap<ActorKind, VecDeque<Millis>>,
}

impl RestartPolicy {
    pub fn new(max_restarts: u32, window: Duration) -> RestartPolicy {
        RestartPolicy {
            max_restarts: max_restarts as usize,
            window_ms: window.as_millis() as Millis,
            failures: HashMap::new(),
        }
    }

    /// Records a failure of `kind` at `now` and decides. More than
    /// `max_restarts` failures within the window escalate.
    pub fn on_failure(&mut self, kind: ActorKind, now: Millis) -> RestartDecision {
        let history = self.failures.entry(kind).or_default();
        while history
            .front()
            .is_some_and(|&at| now - at >= self.window_ms)
        {
            history.pop_front();
        }
        history.push_back(now);
        let count = history.len();
        if count > self.max_restarts {
            RestartDecision::Escalate {
                failures_in_window: count,
            }
        } else {
            RestartDecision::Restart {
                delay: backoff(count as u32 - 1),
                restarts_in_window: count,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(3), Duration::from_millis(800));
        assert_eq!(backoff(20), Duration::from_secs(10));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn the_sixth_failure_within_the_window_escalates() {
        let mut policy = RestartPolicy::new(5, Duration::from_secs(60));
        for i in 0..5 {
            let decision = policy.on_failure(ActorKind::Plan, i * 1_000);
            assert_eq!(
                decision,
                RestartDecision::Restart {
                    delay: backoff(i as u32),
                    restarts_in_window: i as usize + 1
                }
            );
        }
        assert_eq!(
            policy.on_failure(ActorKind::Plan, 5_000),
            RestartDecision::Escalate {
                failures_in_window: 6
            }
        );
    }

    #[test]
    fn failures_outside_the_window_are_forgotten() {
        let mut policy = RestartPolicy::new(5, Duration::from_secs(60));
        for i in 0..5 {
            policy.on_failure(ActorKind::Writer, i * 1_000);
        }
        // The first failures age out, so this is the second in the window.
        assert!(matches!(
            policy.on_failure(ActorKind::Writer, 64_000),
            RestartDecision::Restart { .. }
        ));
    }

    #[test]
    fn actors_are_counted_separately() {
        let mut policy = RestartPolicy::new(1, Duration::from_secs(60));
        assert!(matches!(
            policy.on_failure(ActorKind::Plan, 0),
            RestartDecision::Restart { .. }
        ));
        assert!(matches!(
            policy.on_failure(ActorKind::Writer, 0),
            RestartDecision::Restart { .. }
        ));
        assert!(matches!(
            policy.on_failure(ActorKind::Plan, 1),
            RestartDecision::Escalate { .. }
        ));
    }
}
