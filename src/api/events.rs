//! `GET /api/v1/events`: server-sent events for the console and for
//! anyone who would rather listen than poll.
//!
//! - `hello`: once, on connect: the instance and its clock.
//! - `execution`: an execution appeared or changed status, on any instance
//!   sharing the database (the stored row, output left out).
//! - `throttle`: the memory gate of this instance opened or closed (and its
//!   state on connect).
//!
//! Executions are read from the database, not from this process's actors:
//! several instances share one database, and a console on any of them
//! must see every run. Each connection watches three cheap reads every
//! [`POLL_INTERVAL`], all on indexes the engine keeps anyway: the rows
//! requested since the last look, the open rows, and the rows that were
//! open at the last look (by id). The write path pays nothing for it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::debug;
use uuid::Uuid;

use super::ApiState;
use super::views::Execution;
use crate::actors::ask;
use crate::memory::ThrottleStatus;
use crate::messages::MemoryGuardMsg;
use crate::model::{Execution as StoredExecution, ExecutionStatus, Millis};
use crate::store::ExecutionFilter;

/// How often a connection looks: changes show within this, well inside
/// the console's 2 s promise.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How far behind the newest row seen a second look reaches: covers clocks
/// of other instances a little behind this one's and rows whose
/// transaction committed after a later-stamped one.
const LOOKBACK_MS: Millis = 30_000;
/// Rows per read.
const READ_LIMIT: i64 = 500;
/// Pages of new rows one look reads at most: a burst larger than this
/// shows over the next looks, since the cursor moves on with each page.
const NEW_PAGES_PER_LOOK: usize = 20;
/// Events buffered for a slow client before the connection's reads wait.
const CHANNEL_CAPACITY: usize = 256;

/// The pure half: which rows changed since the last look.
#[derive(Debug, Default)]
pub struct ChangeFeed {
    /// Status and request time of every row seen within the lookback, and
    /// of every open row.
    known: HashMap<Uuid, (ExecutionStatus, Millis)>,
    /// The (requested_at, id) of the newest row seen: new rows are read
    /// after it, a page at a time, so however many runs a second there
    /// are the reads move on (a window read from a fixed start returned
    /// the same oldest rows once it held more than a page).
    cursor: (Millis, Uuid),
}

impl ChangeFeed {
    /// Starts knowing `rows` without reporting them, new rows read after
    /// `cursor`: the client loads its page itself and wants only what
    /// changes after.
    pub fn primed(rows: &[StoredExecution], cursor: (Millis, Uuid)) -> ChangeFeed {
        let mut feed = ChangeFeed {
            known: HashMap::new(),
            cursor,
        };
        feed.observe(rows);
        feed
    }

    /// New rows were read up to `cursor`. Only the read of new rows moves
    /// it: an open row seen beyond a burst not yet read must not skip it.
    pub fn read_up_to(&mut self, cursor: (Millis, Uuid)) {
        self.cursor = self.cursor.max(cursor);
    }

    /// Where new rows start: after this (requested_at, id).
    pub fn cursor(&self) -> (Millis, Uuid) {
        self.cursor
    }

    /// Where the second look, for rows stamped behind the cursor, starts.
    pub fn since(&self) -> Millis {
        self.cursor.0 - LOOKBACK_MS
    }

    /// The rows known open: a look must read them back by id if they left
    /// the open set, to see how they ended.
    pub fn open_ids(&self) -> Vec<Uuid> {
        self.known
            .iter()
            .filter(|(_, (status, _))| !status.is_terminal())
            .map(|(id, _)| *id)
            .collect()
    }

    /// The rows among `rows` that are new or changed status, each once.
    pub fn observe<'a>(&mut self, rows: &'a [StoredExecution]) -> Vec<&'a StoredExecution> {
        let mut changed = Vec::new();
        for row in rows {
            let was = self.known.insert(row.id, (row.status, row.requested_at));
            if was.map(|(status, _)| status) != Some(row.status) {
                changed.push(row);
            }
        }
        let horizon = self.since();
        self.known
            .retain(|_, (status, requested_at)| !status.is_terminal() || *requested_at >= horizon);
        changed
    }
}

/// An mpsc receiver as the `Stream` the SSE body reads.
struct EventStream(mpsc::Receiver<Event>);

impl futures_core::Stream for EventStream {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|event| event.map(Ok))
    }
}

#[utoipa::path(get, path = "/events", tag = "events",
    responses((status = 200, description = "Server-sent events: `hello`, `execution` (a run appeared or changed status, on any instance), `throttle` (this instance's memory gate)", content_type = "text/event-stream", body = String)))]
pub async fn events(
    State(s): State<ApiState>,
) -> Sse<impl futures_core::Stream<Item = Result<Event, Infallible>>> {
    let (sender, receiver) = mpsc::channel(CHANNEL_CAPACITY);
    tokio::spawn(watch(s, sender));
    Sse::new(EventStream(receiver)).keep_alive(KeepAlive::default())
}

fn event(name: &str, data: &serde_json::Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// One connection's loop; ends when the client goes (the send fails).
async fn watch(s: ApiState, sender: mpsc::Sender<Event>) {
    let now = s.clock().now_ms();
    let hello = json!({
        "instance_id": s.config().instance_id,
        "now": super::present::rfc3339(now),
        "poll_interval_ms": POLL_INTERVAL.as_millis() as u64,
    });
    if sender.send(event("hello", &hello)).await.is_err() {
        return;
    }
    let mut feed = ChangeFeed::primed(&[], (now, Uuid::nil()));
    let mut primed = false;
    let mut throttle: Option<ThrottleStatus> = None;
    let mut closing = s.closing();
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            // The server is stopping (or gone): end the stream so the
            // graceful shutdown need not wait for the client.
            _ = closing.wait_for(|closing| *closing) => return,
        }
        if sender.is_closed() {
            return;
        }
        if let Some(status) = throttle_status(&s).await
            && throttle.as_ref() != Some(&status)
        {
            let data = json!({"throttled": status.throttled, "reason": status.reason});
            if sender.send(event("throttle", &data)).await.is_err() {
                return;
            }
            throttle = Some(status);
        }
        let (rows, cursor) = match look(&s, &feed).await {
            Ok(look) => look,
            Err(e) => {
                // The database is away: the console keeps its last page and
                // this connection looks again at the next tick.
                debug!("events: executions not read: {e}");
                continue;
            }
        };
        if !primed {
            let newest = rows.iter().map(|row| (row.requested_at, row.id)).max();
            feed = ChangeFeed::primed(&rows, cursor.max(newest.unwrap_or(cursor)));
            primed = true;
            continue;
        }
        feed.read_up_to(cursor);
        for row in feed.observe(&rows) {
            let data = serde_json::to_value(Execution::shown(row, false)).unwrap_or_default();
            if sender.send(event("execution", &data)).await.is_err() {
                return;
            }
        }
    }
}

async fn throttle_status(s: &ApiState) -> Option<ThrottleStatus> {
    let guard = s.directory().memory_guard()?;
    ask(&guard, MemoryGuardMsg::Status)
        .await
        .ok()
        .map(|status| status.throttle)
}

/// New rows (after the cursor), rows stamped a little behind it, open
/// rows, and the rows that were open, as stored now; and the cursor after
/// the new rows read.
async fn look(
    s: &ApiState,
    feed: &ChangeFeed,
) -> Result<(Vec<StoredExecution>, (Millis, Uuid)), crate::store::StoreError> {
    let store = s.store();
    let mut rows = Vec::new();
    let mut after = feed.cursor();
    for _ in 0..NEW_PAGES_PER_LOOK {
        let page = ExecutionFilter {
            after: Some(after),
            limit: READ_LIMIT,
            ..ExecutionFilter::default()
        };
        let new_rows = store.list_executions(&page).await?;
        let next = page.next_cursor(&new_rows);
        if let Some(last) = new_rows.last() {
            after = (last.requested_at, last.id);
        }
        rows.extend(new_rows);
        if next.is_none() {
            break;
        }
    }
    rows.extend(
        store
            .list_executions(&ExecutionFilter {
                from: Some(feed.since()),
                // Up to the cursor: rows after it are the new rows' read
                // (at a steady rate they would fill this page instead).
                to: Some(feed.cursor().0.saturating_add(1)),
                limit: READ_LIMIT,
                newest_first: true,
                ..ExecutionFilter::default()
            })
            .await?,
    );
    rows.extend(store.open_executions(READ_LIMIT).await?);
    let seen: std::collections::HashSet<Uuid> = rows.iter().map(|row| row.id).collect();
    for id in feed.open_ids() {
        if !seen.contains(&id)
            && let Some(row) = store.execution(id).await?
        {
            rows.push(row);
        }
    }
    Ok((rows, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u128, status: ExecutionStatus, requested_at: Millis) -> StoredExecution {
        StoredExecution {
            id: Uuid::from_u128(id),
            branch_rule_id: Uuid::from_u128(1),
            scheduled_for: requested_at,
            status,
            attempt: 1,
            owner: "me".into(),
            lock_epoch: 1,
            requested_at,
            scheduled_at: None,
            started_at: None,
            finished_at: None,
            error: None,
            output: None,
            created_at: requested_at,
            updated_at: requested_at,
        }
    }

    #[test]
    fn reports_each_change_once() {
        let t = 1_800_000_000_000;
        let mut feed = ChangeFeed::primed(&[row(1, ExecutionStatus::Running, t)], (t, Uuid::nil()));
        assert!(
            feed.observe(&[row(1, ExecutionStatus::Running, t)])
                .is_empty()
        );
        assert_eq!(feed.open_ids(), vec![Uuid::from_u128(1)]);
        let ended = [row(1, ExecutionStatus::Completed, t)];
        assert_eq!(feed.observe(&ended).len(), 1);
        assert!(feed.observe(&ended).is_empty());
        assert!(feed.open_ids().is_empty());
        // A run that started and ended between two looks is still news.
        let quick = [row(2, ExecutionStatus::Completed, t + 10)];
        feed.read_up_to((t + 10, Uuid::from_u128(2)));
        assert_eq!(feed.observe(&quick).len(), 1);
        assert_eq!(feed.since(), t + 10 - LOOKBACK_MS);
        // An open row seen ahead of the new rows read does not move the
        // cursor past them.
        feed.observe(&[row(3, ExecutionStatus::Running, t + 5_000)]);
        assert_eq!(feed.cursor(), (t + 10, Uuid::from_u128(2)));
    }

    #[test]
    fn forgets_finished_rows_past_the_lookback_but_not_open_ones() {
        let t = 1_800_000_000_000;
        let mut feed = ChangeFeed::primed(
            &[
                row(1, ExecutionStatus::Completed, t),
                row(2, ExecutionStatus::Requested, t),
            ],
            (t, Uuid::nil()),
        );
        feed.read_up_to((t + LOOKBACK_MS + 1, Uuid::from_u128(3)));
        feed.observe(&[row(3, ExecutionStatus::Requested, t + LOOKBACK_MS + 1)]);
        assert!(!feed.known.contains_key(&Uuid::from_u128(1)));
        assert!(feed.known.contains_key(&Uuid::from_u128(2)));
    }
}
