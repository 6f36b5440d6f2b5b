//! The execution lifecycle in the store, on both backends: claims, fenced
//! transitions, the post-process, recovery, reads, instances and the
//! group-commit batcher (DESIGN.md §4, seeds 001 and 002).

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use common::{TestDb, execution_count};
use ruled::model::{
    Branch, BranchRule, Brand, Execution, ExecutionStatus, Millis, Rule, RuleStatus,
};
use ruled::store::{
    Claim, ClaimRequest, ExecutionFilter, Fence, Finish, RetryUpdate, Store, Transition,
    TransitionBatcher, TransitionOutcome, WITHDRAWALS_PER_TRANSACTION, WORKER_LOST,
};
use serde_json::json;
use uuid::Uuid;

const T0: Millis = 1_795_000_000_000;
const TIMEOUT: Millis = 300_000;
const HOLDER: &str = "host-a";
const OTHER: &str = "host-b";

// ---- fixtures ----------------------------------------------------------------

fn id(n: u32) -> Uuid {
    Uuid::parse_str(&format!("00000000-0000-4000-8000-{n:012}")).unwrap()
}

/// The brand, branch and rule every branch rule hangs off.
async fn seed(store: &Store) {
    store
        .insert_brand(&Brand {
            id: id(1),
            name: "Acme".into(),
            settings: json!({}),
            created_at: T0,
            updated_at: T0,
        })
        .await
        .unwrap();
    store
        .insert_branch(&Branch {
            id: id(2),
            brand_id: id(1),
            name: "Riyadh".into(),
            timezone: None,
            is_active: true,
            created_at: T0,
            updated_at: T0,
        })
        .await
        .unwrap();
    store
        .insert_rule(&Rule {
            id: id(3),
            brand_id: None,
            name: "nightly".into(),
            status: RuleStatus::Active,
            cron_expression: "30 2 * * *".into(),
            settings: json!({}),
            policy: None,
            created_at: T0,
            updated_at: T0,
        })
        .await
        .unwrap();
}

/// An active, unlocked branch rule `n`, due at `next_run_time`.
fn branch_rule(n: u32, next_run_time: Option<Millis>) -> BranchRule {
    BranchRule {
        id: id(n),
        branch_id: id(2),
        rule_id: id(3),
        brand_rule_id: None,
        is_active: true,
        is_archived: false,
        is_force_stopped: false,
        is_currently_running: false,
        operation_time_from: None,
        operation_time_to: None,
        next_run_time,
        last_run_time: None,
        lock_holder: None,
        lock_time: None,
        lock_epoch: 0,
        params: json!({}),
        policy: None,
        retry_of: None,
        failed_attempts: 0,
        created_at: T0 - 1000,
        updated_at: T0 - 1000,
    }
}

/// A connected store with the seed and branch rules `ns`, all due at T0.
async fn store_with_rules(db: &TestDb, ns: impl IntoIterator<Item = u32>) -> Store {
    let store = db.store().await;
    seed(&store).await;
    for n in ns {
        store
            .insert_branch_rule(&branch_rule(n, Some(T0)))
            .await
            .unwrap();
    }
    store
}

fn request(n: u32, holder: &str, now: Millis) -> ClaimRequest {
    ClaimRequest {
        branch_rule_id: id(n),
        holder: holder.into(),
        now,
        lock_timeout_ms: TIMEOUT,
        execution_id: Uuid::new_v4(),
        run_now: false,
        due_by: None,
    }
}

async fn claim(store: &Store, n: u32, holder: &str, now: Millis) -> Claim {
    store
        .claim(&request(n, holder, now))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{holder} could not claim branch rule {n} at {now}"))
}

async fn rule(store: &Store, n: u32) -> BranchRule {
    store
        .load_plan_data(0)
        .await
        .unwrap()
        .branch_rules
        .into_iter()
        .find(|r| r.id == id(n))
        .unwrap_or_else(|| panic!("branch rule {n} is missing"))
}

async fn execution(store: &Store, execution_id: Uuid) -> Execution {
    store.execution(execution_id).await.unwrap().unwrap()
}

fn completed(at: Millis, next: Option<Millis>) -> Finish {
    Finish {
        status: ExecutionStatus::Completed,
        finished_at: at,
        error: None,
        output: Some(json!({"ok": true})),
        next_run_time: next,
        advance_last_run: true,
        retry: RetryUpdate::Keep,
        skipped: Vec::new(),
        clear_next_run: false,
    }
}

// ---- claims ------------------------------------------------------------------

both_backends!(
    claim_locks_the_rule_and_inserts_attempt_one,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10]).await;
        let now = T0 + 5;
        let req = request(10, HOLDER, now);
        let won = store
            .claim(&req)
            .await
            .unwrap()
            .expect("a due rule is claimed");

        let row = &won.branch_rule;
        assert_eq!(row.lock_holder.as_deref(), Some(HOLDER));
        assert_eq!(row.lock_time, Some(now));
        assert_eq!(row.lock_epoch, 1, "the claim increments the epoch");
        assert!(row.is_currently_running);
        assert_eq!(row.updated_at, now);
        assert_eq!(
            row.next_run_time,
            Some(T0),
            "the claim leaves the schedule alone"
        );
        assert_eq!(
            *row,
            rule(&store, 10).await,
            "the returned row is the stored row"
        );

        let e = &won.execution;
        assert_eq!(e.id, req.execution_id);
        assert_eq!(e.branch_rule_id, id(10));
        assert_eq!(e.status, ExecutionStatus::Requested);
        assert_eq!(
            e.scheduled_for, T0,
            "the occurrence is the rule's next_run_time"
        );
        assert_eq!(e.attempt, 1);
        assert_eq!(e.owner, HOLDER);
        assert_eq!(e.lock_epoch, 1);
        assert_eq!(e.requested_at, now);
        assert_eq!(
            (e.scheduled_at, e.started_at, e.finished_at),
            (None, None, None)
        );
        assert_eq!((e.error.as_deref(), e.output.as_ref()), (None, None));
        assert_eq!(*e, execution(&store, req.execution_id).await);

        assert_eq!(
            won.fence(),
            Fence {
                execution_id: req.execution_id,
                branch_rule_id: id(10),
                holder: HOLDER.into(),
                epoch: 1,
            }
        );
    }
);

/// Whether the one claim of `fence` was withdrawn.
async fn withdrawn(store: &Store, fence: &Fence, now: Millis) -> bool {
    let answer = store
        .withdraw_claims(std::slice::from_ref(fence), now)
        .await
        .unwrap();
    answer == [true]
}

// MASTER_CLAIM_LEAD_SECONDS: a rule is claimed up to the lead before it is
// due, never earlier; and such a claim, given back before it fell due, is
// withdrawn: the lock freed and the requested execution gone, so the next
// claim of the occurrence is attempt 1 again. Only by the fence's holder
// and epoch.
both_backends!(
    a_claim_made_ahead_of_its_due_time_is_withdrawn_as_if_never_made,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10]).await;
        let early = T0 - 500;
        let too_soon = ClaimRequest {
            due_by: Some(T0 - 1),
            ..request(10, HOLDER, early)
        };
        assert!(
            store.claim(&too_soon).await.unwrap().is_none(),
            "not due by then"
        );
        let ahead = ClaimRequest {
            due_by: Some(T0),
            ..request(10, HOLDER, early)
        };
        let won = store.claim(&ahead).await.unwrap().expect("due by T0");
        assert_eq!(won.execution.scheduled_for, T0);
        assert_eq!(won.execution.requested_at, early, "requested when claimed");
        assert_eq!(won.branch_rule.lock_time, Some(early));

        let mut stale = won.fence();
        stale.epoch += 1;
        assert!(!withdrawn(&store, &stale, early + 10).await);
        let other = Fence {
            holder: "someone-else".into(),
            ..won.fence()
        };
        assert!(!withdrawn(&store, &other, early + 10).await);
        assert_eq!(execution(&store, won.execution.id).await, won.execution);

        assert!(withdrawn(&store, &won.fence(), early + 10).await);
        assert_eq!(store.execution(won.execution.id).await.unwrap(), None);
        let row = rule(&store, 10).await;
        assert_eq!((row.lock_holder, row.lock_time), (None, None));
        assert!(!row.is_currently_running);
        assert_eq!(row.next_run_time, Some(T0), "the occurrence is still due");
        assert!(
            !withdrawn(&store, &won.fence(), early + 20).await,
            "withdrawn once"
        );

        let again = claim(&store, 10, "another", T0 + 5).await;
        assert_eq!(again.execution.attempt, 1);
        assert_eq!(again.execution.scheduled_for, T0);
        assert_eq!(again.branch_rule.lock_epoch, 2, "the epoch never goes back");
        // A claim whose job moved on (scheduled) is not withdrawn.
        store
            .apply(&Transition::Scheduled {
                fence: again.fence(),
                now: T0 + 6,
            })
            .await
            .unwrap();
        assert!(!withdrawn(&store, &again.fence(), T0 + 7).await);
        let row = rule(&store, 10).await;
        assert_eq!(row.lock_holder.as_deref(), Some("another"), "rolled back");
        assert_eq!(
            execution(&store, again.execution.id).await.status,
            ExecutionStatus::Scheduled
        );
    }
);

// A stop gives back its claims made ahead together (one transaction for
// up to WITHDRAWALS_PER_TRANSACTION): each is withdrawn whole or not at
// all, so one taken over or moved on (its lock freed, then its execution
// found past requested) is left exactly as it was while the others around
// it are withdrawn.
both_backends!(
    claims_withdrawn_together_are_each_withdrawn_whole_or_not_at_all,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10, 11, 12, 13]).await;
        let early = T0 - 500;
        let mut fences = Vec::new();
        let mut claims = Vec::new();
        for n in [10, 11, 12, 13] {
            let ahead = ClaimRequest {
                due_by: Some(T0),
                ..request(n, HOLDER, early)
            };
            let won = store.claim(&ahead).await.unwrap().expect("due by T0");
            fences.push(won.fence());
            claims.push(won);
        }
        store
            .apply(&Transition::Scheduled {
                fence: claims[0].fence(),
                now: early + 5,
            })
            .await
            .unwrap();
        fences[2].epoch += 1;

        // Given out of id order, answered in the order given.
        fences.reverse();
        let withdrawn = store.withdraw_claims(&fences, early + 10).await.unwrap();
        assert_eq!(withdrawn, [true, false, true, false]);
        for n in [1, 3] {
            assert_eq!(store.execution(claims[n].execution.id).await.unwrap(), None);
            let row = rule(&store, 10 + n as u32).await;
            assert_eq!((row.lock_holder, row.is_currently_running), (None, false));
        }
        for n in [0, 2] {
            let row = rule(&store, 10 + n as u32).await;
            assert_eq!(row.lock_holder.as_deref(), Some(HOLDER), "rule {n} kept");
            assert_eq!(row.lock_time, Some(early));
            assert!(row.is_currently_running);
        }
        assert_eq!(
            execution(&store, claims[0].execution.id).await.status,
            ExecutionStatus::Scheduled
        );
        assert_eq!(
            execution(&store, claims[2].execution.id).await,
            claims[2].execution
        );
        assert_eq!(
            store.withdraw_claims(&[], early + 20).await.unwrap(),
            Vec::<bool>::new()
        );
    }
);

// More claims than one transaction withdraws: each transaction commits
// its own, and one refused in a later transaction leaves the rest withdrawn.
both_backends!(
    claims_beyond_one_transaction_are_withdrawn_in_several,
    |db: TestDb| async move {
        let count = 2 * WITHDRAWALS_PER_TRANSACTION as u32 + 1;
        let ns: Vec<u32> = (100..100 + count).collect();
        let store = store_with_rules(&db, ns.iter().copied()).await;
        let early = T0 - 500;
        let requests: Vec<ClaimRequest> = ns
            .iter()
            .map(|&n| ClaimRequest {
                due_by: Some(T0),
                ..request(n, HOLDER, early)
            })
            .collect();
        let claims: Vec<Claim> = store
            .claim_batch(&requests)
            .await
            .unwrap()
            .into_iter()
            .map(|won| won.expect("due by T0"))
            .collect();
        let mut fences: Vec<Fence> = claims.iter().map(Claim::fence).collect();
        fences.sort_by_key(|fence| fence.branch_rule_id);
        let refused = fences[WITHDRAWALS_PER_TRANSACTION + 3].branch_rule_id;
        fences[WITHDRAWALS_PER_TRANSACTION + 3].epoch += 1;

        let withdrawn = store.withdraw_claims(&fences, early + 10).await.unwrap();
        let answered: Vec<bool> = fences
            .iter()
            .map(|fence| fence.branch_rule_id != refused)
            .collect();
        assert_eq!(withdrawn, answered);
        for won in &claims {
            let kept = won.branch_rule.id == refused;
            let stored = store.execution(won.execution.id).await.unwrap();
            assert_eq!(
                stored.is_some(),
                kept,
                "execution of {}",
                won.branch_rule.id
            );
        }
        for &n in &ns {
            let kept = id(n) == refused;
            let row = rule(&store, n).await;
            assert_eq!(row.lock_holder.is_some(), kept, "lock of {n}");
        }
    }
);

both_backends!(updated_at_only_moves_forward, |db: TestDb| async move {
    let store = store_with_rules(&db, []).await;
    // Last touched in the very millisecond of the claim, then by a clock
    // that runs ahead of the claimer's.
    let same_ms = BranchRule {
        updated_at: T0,
        ..branch_rule(10, Some(T0))
    };
    let ahead = BranchRule {
        updated_at: T0 + 5_000,
        ..branch_rule(11, Some(T0))
    };
    store.insert_branch_rule(&same_ms).await.unwrap();
    store.insert_branch_rule(&ahead).await.unwrap();

    let won = claim(&store, 10, HOLDER, T0).await;
    assert_eq!(won.branch_rule.updated_at, T0 + 1);
    assert_eq!(
        won.branch_rule,
        rule(&store, 10).await,
        "the returned row is the stored row"
    );
    let row = store
        .finish(&won.fence(), &completed(T0 + 1, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.updated_at, T0 + 2);
    assert_eq!(row, rule(&store, 10).await);

    let won = claim(&store, 11, HOLDER, T0).await;
    assert_eq!(won.branch_rule.updated_at, T0 + 5_001);
    assert!(store.renew_lock(&won.fence(), T0 + 10).await.unwrap());
    assert_eq!(rule(&store, 11).await.updated_at, T0 + 5_002);
});

both_backends!(
    claim_is_refused_unless_due_runnable_and_free,
    |db: TestDb| async move {
        let store = store_with_rules(&db, []).await;
        let mut not_due = branch_rule(10, Some(T0 + 1));
        not_due.params = json!({"case": "not due"});
        let never = branch_rule(11, None);
        let mut inactive = branch_rule(12, Some(T0));
        inactive.is_active = false;
        let mut archived = branch_rule(13, Some(T0));
        archived.is_archived = true;
        let force_stopped = branch_rule(14, Some(T0));
        let mut locked = branch_rule(15, Some(T0));
        locked.lock_holder = Some(OTHER.into());
        locked.lock_time = Some(T0 - TIMEOUT); // exactly the timeout old: still fresh
        locked.lock_epoch = 7;
        locked.is_currently_running = true;
        for row in [
            &not_due,
            &never,
            &inactive,
            &archived,
            &force_stopped,
            &locked,
        ] {
            store.insert_branch_rule(row).await.unwrap();
        }
        assert!(
            store
                .set_force_stopped(id(14), true, T0 - 1000)
                .await
                .unwrap()
        );
        assert!(!store.set_force_stopped(id(99), true, T0).await.unwrap());

        for n in 10..=15 {
            let before = rule(&store, n).await;
            let claimed = store.claim(&request(n, HOLDER, T0)).await.unwrap();
            assert!(claimed.is_none(), "branch rule {n} must not be claimed");
            assert_eq!(
                rule(&store, n).await,
                before,
                "a refused claim changes nothing"
            );
        }
        assert_eq!(execution_count(&store).await, 0);

        // Clearing the force stop makes it claimable again.
        assert!(store.set_force_stopped(id(14), false, T0).await.unwrap());
        claim(&store, 14, HOLDER, T0).await;
    }
);

both_backends!(
    a_stale_lock_is_taken_over_as_a_new_attempt,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10]).await;
        let first = claim(&store, 10, HOLDER, T0).await;

        // Our own fresh lock is not claimed twice either.
        assert!(
            store
                .claim(&request(10, HOLDER, T0 + 1))
                .await
                .unwrap()
                .is_none()
        );
        let at_timeout = request(10, OTHER, T0 + TIMEOUT);
        assert!(store.claim(&at_timeout).await.unwrap().is_none());

        let second = claim(&store, 10, OTHER, T0 + TIMEOUT + 1).await;
        assert_eq!(second.branch_rule.lock_holder.as_deref(), Some(OTHER));
        assert_eq!(second.branch_rule.lock_epoch, 2);
        assert_eq!(
            second.execution.scheduled_for,
            first.execution.scheduled_for
        );
        assert_eq!(second.execution.attempt, 2);

        // The first owner is fenced out of every write.
        let stale = first.fence();
        assert!(
            !store
                .mark_scheduled(&stale, T0 + TIMEOUT + 2)
                .await
                .unwrap()
        );
        assert!(!store.renew_lock(&stale, T0 + TIMEOUT + 2).await.unwrap());
        let before = rule(&store, 10).await;
        assert_eq!(
            store
                .finish(&stale, &completed(T0 + TIMEOUT + 3, Some(T0 + 99)))
                .await
                .unwrap(),
            None
        );
        assert_eq!(rule(&store, 10).await, before);
        // The taker recorded the attempt it took over: nothing stays open.
        let taken = execution(&store, first.execution.id).await;
        assert_eq!(taken.status, ExecutionStatus::Failed);
        assert_eq!(taken.finished_at, Some(T0 + TIMEOUT + 1));
        assert!(
            taken
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("lock_lost") && e.contains(OTHER)),
            "{taken:?}"
        );
    }
);

both_backends!(run_now_ignores_the_due_time_only, |db: TestDb| async move {
    let store = store_with_rules(&db, []).await;
    store
        .insert_branch_rule(&branch_rule(10, Some(T0 + 3_600_000)))
        .await
        .unwrap();
    store
        .insert_branch_rule(&branch_rule(11, None))
        .await
        .unwrap();
    let mut inactive = branch_rule(12, None);
    inactive.is_active = false;
    store.insert_branch_rule(&inactive).await.unwrap();

    for n in [10, 11] {
        let mut req = request(n, HOLDER, T0 + 7);
        req.run_now = true;
        let won = store
            .claim(&req)
            .await
            .unwrap()
            .expect("run-now claims a rule not yet due");
        assert_eq!(
            won.execution.scheduled_for,
            T0 + 7,
            "run-now's occurrence is now"
        );
        assert_eq!(won.execution.attempt, 1);
    }
    assert_eq!(rule(&store, 10).await.next_run_time, Some(T0 + 3_600_000));

    let mut req = request(12, HOLDER, T0);
    req.run_now = true;
    assert!(
        store.claim(&req).await.unwrap().is_none(),
        "run-now still needs an active rule"
    );
    let mut again = request(10, OTHER, T0 + 8);
    again.run_now = true;
    assert!(
        store.claim(&again).await.unwrap().is_none(),
        "run-now still needs the lock"
    );
});

both_backends!(
    concurrent_claims_have_exactly_one_winner,
    tokio::test(flavor = "multi_thread", worker_threads = 4),
    |db: TestDb| async move {
        const RULES: u32 = 20;
        // Two pools, as two instances of ruled would have.
        let a = store_with_rules(&db, 100..100 + RULES).await;
        let b = db.store().await;
        let mut races = Vec::new();
        for n in 100..100 + RULES {
            let (a, b) = (a.clone(), b.clone());
            races.push(tokio::spawn(async move {
                let barrier = Arc::new(tokio::sync::Barrier::new(2));
                let (ba, bb) = (barrier.clone(), barrier);
                let one = tokio::spawn(async move {
                    ba.wait().await;
                    a.claim(&request(n, HOLDER, T0)).await.unwrap()
                });
                let two = tokio::spawn(async move {
                    bb.wait().await;
                    b.claim(&request(n, OTHER, T0)).await.unwrap()
                });
                (n, one.await.unwrap(), two.await.unwrap())
            }));
        }
        for race in races {
            let (n, one, two) = race.await.unwrap();
            let winners = [&one, &two].iter().filter(|c| c.is_some()).count();
            assert_eq!(winners, 1, "branch rule {n}: exactly one claim wins");
            let winner = one.or(two).unwrap();
            assert_eq!(winner.branch_rule.lock_epoch, 1);
            assert_eq!(
                rule(&a, n).await.lock_holder,
                Some(winner.execution.owner.clone())
            );
            assert_eq!(a.executions_for(id(n)).await.unwrap().len(), 1);
        }
        b.close().await;
        a.close().await;
    }
);

both_backends!(
    claim_batch_claims_in_one_transaction,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10, 11]).await;
        store
            .insert_branch_rule(&branch_rule(12, Some(T0 + 1)))
            .await
            .unwrap();
        let requests = [
            request(10, HOLDER, T0),
            request(12, HOLDER, T0),
            request(11, HOLDER, T0),
        ];
        let claims = store.claim_batch(&requests).await.unwrap();
        let won: Vec<bool> = claims.iter().map(Option::is_some).collect();
        assert_eq!(won, [true, false, true]);
        assert_eq!(
            claims[2].as_ref().unwrap().execution.id,
            requests[2].execution_id
        );
        assert_eq!(store.claim_batch(&[]).await.unwrap(), vec![]);
    }
);

both_backends!(
    the_occurrence_key_refuses_a_second_row,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10]).await;
        let won = claim(&store, 10, HOLDER, T0).await;
        let duplicate = format!(
            "INSERT INTO executions (id, branch_rule_id, scheduled_for, status, attempt, owner, lock_epoch, requested_at) \
         VALUES ('{}', '{}', {}, 'requested', 1, 'x', 1, {T0})",
            Uuid::new_v4(),
            id(10),
            won.execution.scheduled_for
        );
        let error = store.execute_sql(&duplicate).await.unwrap_err();
        assert!(error.is_unique_violation(), "{error}");
    }
);

// ---- transitions -------------------------------------------------------------

both_backends!(
    each_transition_is_written_once_and_in_order,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10]).await;
        let won = claim(&store, 10, HOLDER, T0).await;
        let fence = won.fence();

        assert!(
            !store.mark_running(&fence, T0 + 1).await.unwrap(),
            "not yet scheduled"
        );
        assert!(store.mark_scheduled(&fence, T0 + 2).await.unwrap());
        assert!(
            !store.mark_scheduled(&fence, T0 + 3).await.unwrap(),
            "written once"
        );
        let e = execution(&store, fence.execution_id).await;
        assert_eq!(
            (e.status, e.scheduled_at, e.updated_at),
            (ExecutionStatus::Scheduled, Some(T0 + 2), T0 + 2)
        );

        assert!(store.mark_running(&fence, T0 + 4).await.unwrap());
        assert!(
            !store.mark_running(&fence, T0 + 5).await.unwrap(),
            "written once"
        );
        assert!(
            !store.mark_scheduled(&fence, T0 + 5).await.unwrap(),
            "no way back"
        );
        let e = execution(&store, fence.execution_id).await;
        assert_eq!(
            (e.status, e.started_at),
            (ExecutionStatus::Running, Some(T0 + 4))
        );
        assert_eq!(e.scheduled_at, Some(T0 + 2), "earlier timestamps are kept");

        assert!(store.renew_lock(&fence, T0 + 100).await.unwrap());
        assert_eq!(rule(&store, 10).await.lock_time, Some(T0 + 100));

        let finish = Finish {
            status: ExecutionStatus::Failed,
            finished_at: T0 + 200,
            error: Some("boom".into()),
            output: Some(json!({"step": 2})),
            next_run_time: Some(T0 + 86_400_000),
            advance_last_run: true,
            retry: RetryUpdate::Keep,
            skipped: Vec::new(),
            clear_next_run: false,
        };
        assert!(store.finish(&fence, &finish).await.unwrap().is_some());
        let e = execution(&store, fence.execution_id).await;
        assert_eq!(e.status, ExecutionStatus::Failed);
        assert_eq!(e.finished_at, Some(T0 + 200));
        assert_eq!(e.error.as_deref(), Some("boom"));
        assert_eq!(e.output, Some(json!({"step": 2})));

        // Terminal is final: nothing moves it, not even the same finish again.
        assert!(!store.mark_scheduled(&fence, T0 + 300).await.unwrap());
        assert!(!store.mark_running(&fence, T0 + 300).await.unwrap());
        assert!(!store.renew_lock(&fence, T0 + 300).await.unwrap());
        assert_eq!(
            store
                .finish(&fence, &completed(T0 + 300, None))
                .await
                .unwrap(),
            None
        );
        assert_eq!(execution(&store, fence.execution_id).await, e);
    }
);

// A handler's message may hold NUL, which PostgreSQL's text refuses: the
// finish must land anyway, or it would wait in the outbox for good.
both_backends!(
    a_finish_whose_error_holds_a_nul_byte_is_recorded,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [11]).await;
        let fence = claim(&store, 11, HOLDER, T0).await.fence();
        let finish = Finish {
            status: ExecutionStatus::Failed,
            error: Some("bad\0byte".into()),
            output: Some(json!({"stdout": "a\u{0}b"})),
            ..completed(T0 + 10, Some(T0 + 86_400_000))
        };
        assert!(store.finish(&fence, &finish).await.unwrap().is_some());
        let e = execution(&store, fence.execution_id).await;
        assert_eq!(e.status, ExecutionStatus::Failed);
        assert_eq!(e.error.as_deref(), Some("bad\u{FFFD}byte"));
        assert_eq!(e.output, Some(json!({"stdout": "a\u{0}b"})));
    }
);

both_backends!(a_stale_owner_changes_nothing, |db: TestDb| async move {
    let store = store_with_rules(&db, [10]).await;
    let won = claim(&store, 10, HOLDER, T0).await;
    let fence = won.fence();
    assert!(store.mark_scheduled(&fence, T0 + 1).await.unwrap());

    let wrong_epoch = Fence {
        epoch: fence.epoch - 1,
        ..fence.clone()
    };
    let newer_epoch = Fence {
        epoch: fence.epoch + 1,
        ..fence.clone()
    };
    let wrong_holder = Fence {
        holder: OTHER.into(),
        ..fence.clone()
    };
    let rule_before = rule(&store, 10).await;
    let execution_before = execution(&store, fence.execution_id).await;
    for stale in [&wrong_epoch, &newer_epoch, &wrong_holder] {
        assert!(
            !store.mark_running(stale, T0 + 2).await.unwrap(),
            "{stale:?}"
        );
        assert!(!store.renew_lock(stale, T0 + 2).await.unwrap(), "{stale:?}");
        assert_eq!(
            store
                .finish(stale, &completed(T0 + 3, Some(T0 + 9)))
                .await
                .unwrap(),
            None
        );
    }
    assert_eq!(rule(&store, 10).await, rule_before);
    assert_eq!(
        execution(&store, fence.execution_id).await,
        execution_before
    );

    // The real owner is unaffected.
    assert!(store.mark_running(&fence, T0 + 4).await.unwrap());
});

both_backends!(
    finish_releases_the_lock_and_sets_the_schedule,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10, 11]).await;
        let won = claim(&store, 10, HOLDER, T0).await;
        let fence = won.fence();
        assert!(store.mark_scheduled(&fence, T0 + 1).await.unwrap());
        assert!(store.mark_running(&fence, T0 + 2).await.unwrap());

        let next = T0 + 86_400_000;
        let row = store
            .finish(&fence, &completed(T0 + 50, Some(next)))
            .await
            .unwrap()
            .expect("the owner finishes");
        assert_eq!(
            row,
            rule(&store, 10).await,
            "the returned row is the stored row"
        );
        assert_eq!((row.lock_holder, row.lock_time), (None, None));
        assert!(!row.is_currently_running);
        assert_eq!(row.last_run_time, Some(T0 + 50));
        assert_eq!(row.next_run_time, Some(next));
        assert_eq!(row.lock_epoch, 1, "the epoch only grows on claims");
        assert_eq!(row.updated_at, T0 + 50);
        let e = execution(&store, fence.execution_id).await;
        assert_eq!(
            (e.status, e.finished_at),
            (ExecutionStatus::Completed, Some(T0 + 50))
        );
        assert_eq!(e.output, Some(json!({"ok": true})));

        // Not due until `next`; then the next occurrence starts over at attempt 1.
        assert!(
            store
                .claim(&request(10, HOLDER, next - 1))
                .await
                .unwrap()
                .is_none()
        );
        let again = claim(&store, 10, OTHER, next).await;
        assert_eq!(
            (again.execution.scheduled_for, again.execution.attempt),
            (next, 1)
        );
        assert_eq!(again.branch_rule.lock_epoch, 2);

        // A cancel before the handoff: nothing ran, the schedule stays as it is.
        let won = claim(&store, 11, HOLDER, T0).await;
        let cancel = Finish {
            status: ExecutionStatus::Cancelled,
            finished_at: T0 + 5,
            error: Some("cancelled by operator".into()),
            output: None,
            next_run_time: None,
            advance_last_run: false,
            retry: RetryUpdate::Keep,
            skipped: Vec::new(),
            clear_next_run: false,
        };
        let row = store.finish(&won.fence(), &cancel).await.unwrap().unwrap();
        assert_eq!((row.next_run_time, row.last_run_time), (Some(T0), None));
        assert_eq!(row.lock_holder, None);
        let e = execution(&store, won.execution.id).await;
        assert_eq!(
            (e.status, e.scheduled_at),
            (ExecutionStatus::Cancelled, None)
        );
    }
);

both_backends!(
    finish_refuses_a_non_terminal_status,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10]).await;
        let won = claim(&store, 10, HOLDER, T0).await;
        let before = rule(&store, 10).await;
        let not_terminal = Finish {
            status: ExecutionStatus::Running,
            ..completed(T0 + 1, Some(T0 + 2))
        };
        let error = store.finish(&won.fence(), &not_terminal).await.unwrap_err();
        assert!(error.to_string().contains("not terminal"), "{error}");
        assert!(!error.is_transient());
        assert_eq!(rule(&store, 10).await, before);
    }
);

both_backends!(
    oversized_output_and_error_are_capped,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10]).await;
        let won = claim(&store, 10, HOLDER, T0).await;
        let finish = Finish {
            status: ExecutionStatus::Failed,
            finished_at: T0 + 1,
            error: Some("é".repeat(ruled::store::ERROR_CAP_BYTES)),
            output: Some(json!({"log": "x".repeat(ruled::store::OUTPUT_CAP_BYTES)})),
            next_run_time: None,
            advance_last_run: true,
            retry: RetryUpdate::Keep,
            skipped: Vec::new(),
            clear_next_run: false,
        };
        store.finish(&won.fence(), &finish).await.unwrap().unwrap();
        let e = execution(&store, won.execution.id).await;
        let error = e.error.unwrap();
        assert!(error.len() <= ruled::store::ERROR_CAP_BYTES && error.chars().all(|c| c == 'é'));
        let output = e.output.unwrap();
        assert_eq!(output["truncated"], true, "{output}");
    }
);

// ---- recovery ----------------------------------------------------------------

both_backends!(
    recover_owner_fails_its_work_and_releases_its_locks,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10, 11, 12, 13]).await;
        let requested = claim(&store, 10, HOLDER, T0).await;
        let running = claim(&store, 11, HOLDER, T0).await;
        assert!(
            store
                .mark_scheduled(&running.fence(), T0 + 1)
                .await
                .unwrap()
        );
        assert!(store.mark_running(&running.fence(), T0 + 2).await.unwrap());
        let others = claim(&store, 12, OTHER, T0).await;
        let done = claim(&store, 13, HOLDER, T0).await;
        store
            .finish(&done.fence(), &completed(T0 + 3, Some(T0 + 86_400_000)))
            .await
            .unwrap()
            .unwrap();
        let done_before = execution(&store, done.execution.id).await;

        let now = T0 + 1_000;
        let mut failed = store.recover_owner(HOLDER, now).await.unwrap();
        failed.sort_by_key(|e| e.branch_rule_id);
        let ids: Vec<Uuid> = failed.iter().map(|e| e.id).collect();
        assert_eq!(ids, [requested.execution.id, running.execution.id]);
        for e in &failed {
            assert_eq!(e.status, ExecutionStatus::Failed);
            assert_eq!(e.error.as_deref(), Some(WORKER_LOST));
            assert_eq!(e.finished_at, Some(now));
            assert_eq!(*e, execution(&store, e.id).await);
        }
        for n in [10, 11] {
            let row = rule(&store, n).await;
            assert_eq!((row.lock_holder, row.lock_time), (None, None), "rule {n}");
            assert!(!row.is_currently_running);
            assert_eq!(row.next_run_time, Some(T0), "the occurrence is still due");
            assert_eq!(row.retry_of, Some(T0), "owed its run, rule {n}");
            assert_eq!(row.failed_attempts, 0, "a lost run is no failure");
        }
        assert_eq!(rule(&store, 13).await.retry_of, None);
        assert_eq!(rule(&store, 12).await.lock_holder.as_deref(), Some(OTHER));
        assert_eq!(
            execution(&store, others.execution.id).await.status,
            ExecutionStatus::Requested
        );
        assert_eq!(execution(&store, done.execution.id).await, done_before);
        assert!(
            store
                .recover_owner(HOLDER, now + 1)
                .await
                .unwrap()
                .is_empty(),
            "idempotent"
        );

        // The lost occurrence runs again as attempt 2; the old owner is fenced out.
        let retry = claim(&store, 11, OTHER, now + 1).await;
        assert_eq!(
            retry.execution.scheduled_for,
            running.execution.scheduled_for
        );
        assert_eq!(retry.execution.attempt, 2);
        assert!(!store.mark_running(&running.fence(), now + 2).await.unwrap());
        assert_eq!(
            store
                .finish(&running.fence(), &completed(now + 3, None))
                .await
                .unwrap(),
            None
        );
        let attempts: Vec<(i64, ExecutionStatus)> = store
            .executions_for(id(11))
            .await
            .unwrap()
            .iter()
            .map(|e| (e.attempt, e.status))
            .collect();
        assert_eq!(
            attempts,
            [
                (1, ExecutionStatus::Failed),
                (2, ExecutionStatus::Requested)
            ]
        );
    }
);

// ---- reads -------------------------------------------------------------------

both_backends!(
    list_executions_filters_and_paginates,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10, 11]).await;
        // Six executions, alternating rules, requested at T0, T0+10, ...; the
        // first two share a requested_at so the cursor's id tie-break matters.
        let mut all = Vec::new();
        for i in 0..6_i64 {
            let n = if i % 2 == 0 { 10 } else { 11 };
            let now = T0 + (i.max(1) - 1) * 10;
            let won = claim(&store, n, HOLDER, now).await;
            let status = if i < 4 {
                ExecutionStatus::Completed
            } else {
                ExecutionStatus::Requested
            };
            if status.is_terminal() {
                store
                    .finish(&won.fence(), &completed(now + 1, Some(now + 1)))
                    .await
                    .unwrap()
                    .unwrap();
            }
            all.push(execution(&store, won.execution.id).await);
        }
        all.sort_by_key(|e| (e.requested_at, e.id.hyphenated().to_string()));

        let everything = ExecutionFilter {
            limit: 100,
            ..ExecutionFilter::default()
        };
        assert_eq!(store.list_executions(&everything).await.unwrap(), all);

        // Pages of two, each starting after the previous page's last row.
        let mut filter = ExecutionFilter {
            limit: 2,
            ..ExecutionFilter::default()
        };
        let mut pages = Vec::new();
        loop {
            let page = store.list_executions(&filter).await.unwrap();
            assert!(page.len() <= 2);
            pages.extend(page.iter().cloned());
            match filter.next_cursor(&page) {
                Some(cursor) => filter.after = Some(cursor),
                None => break,
            }
        }
        assert_eq!(pages, all);

        let by_rule = ExecutionFilter {
            branch_rule_id: Some(id(11)),
            ..everything.clone()
        };
        let got = store.list_executions(&by_rule).await.unwrap();
        assert_eq!(
            got,
            all.iter()
                .filter(|e| e.branch_rule_id == id(11))
                .cloned()
                .collect::<Vec<_>>()
        );

        let open = ExecutionFilter {
            status: Some(ExecutionStatus::Requested),
            ..everything.clone()
        };
        assert_eq!(store.list_executions(&open).await.unwrap().len(), 2);

        // Finished executions by status, paged (the partial index on
        // finished rows serves these): exactly the completed ones, in order.
        let mut completed = ExecutionFilter {
            status: Some(ExecutionStatus::Completed),
            limit: 3,
            ..ExecutionFilter::default()
        };
        let mut pages = Vec::new();
        loop {
            let page = store.list_executions(&completed).await.unwrap();
            pages.extend(page.iter().cloned());
            match completed.next_cursor(&page) {
                Some(cursor) => completed.after = Some(cursor),
                None => break,
            }
        }
        let expected: Vec<_> = all
            .iter()
            .filter(|e| e.status == ExecutionStatus::Completed)
            .cloned()
            .collect();
        assert_eq!(expected.len(), 4);
        assert_eq!(pages, expected);

        let window = ExecutionFilter {
            from: Some(T0 + 10),
            to: Some(T0 + 30),
            ..everything.clone()
        };
        let got = store.list_executions(&window).await.unwrap();
        assert!(
            got.iter()
                .all(|e| (T0 + 10..T0 + 30).contains(&e.requested_at))
        );
        assert_eq!(got.len(), 2);

        let none = ExecutionFilter {
            limit: 0,
            ..everything.clone()
        };
        assert!(store.list_executions(&none).await.unwrap().is_empty());

        let counts = store.count_executions_by_status().await.unwrap();
        assert_eq!(counts.len(), ExecutionStatus::ALL.len(), "zeros included");
        let count = |s| counts.iter().find(|(status, _)| *status == s).unwrap().1;
        assert_eq!(count(ExecutionStatus::Completed), 4);
        assert_eq!(count(ExecutionStatus::Requested), 2);
        assert_eq!(count(ExecutionStatus::Running), 0);

        let for_rule = store.executions_for(id(10)).await.unwrap();
        let keys: Vec<(Millis, i64)> = for_rule
            .iter()
            .map(|e| (e.scheduled_for, e.attempt))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        assert_eq!(for_rule.len(), 3);
        assert_eq!(store.execution(Uuid::new_v4()).await.unwrap(), None);
    }
);

// ---- instances ---------------------------------------------------------------

both_backends!(
    instances_register_heartbeat_and_go_stale,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10, 11, 12]).await;
        store
            .register_instance("a", "host-1", 100, T0, None)
            .await
            .unwrap();
        // Heartbeats are stamped on the database's clock, not the caller's.
        let a = store.instance("a").await.unwrap().unwrap();
        let db_now = store.db_now().await.unwrap();
        assert_eq!(
            (a.hostname.as_str(), a.pid, a.started_at),
            ("host-1", 100, T0)
        );
        assert!(
            (db_now - a.heartbeat_at).abs() < 60_000,
            "{a:?} vs {db_now}"
        );
        assert_eq!(a.partition, None);

        // A restart under the same id replaces the row.
        store
            .register_instance("a", "host-1", 200, T0 + 10, Some("0/2"))
            .await
            .unwrap();
        let a = store.instance("a").await.unwrap().unwrap();
        assert_eq!((a.pid, a.started_at), (200, T0 + 10));
        assert_eq!(a.partition.as_deref(), Some("0/2"));
        let beat = store.heartbeat("a", T0 + 20).await.unwrap().unwrap();
        assert_eq!(
            store.instance("a").await.unwrap().unwrap().heartbeat_at,
            beat
        );
        assert_eq!(store.heartbeat("nobody", T0).await.unwrap(), None);
        assert_eq!(store.instance("nobody").await.unwrap(), None);

        // a: silent, holds a lock. b: silent, holds nothing. c: alive, holds a
        // lock. d: silent, its lock expired and c took it over.
        for name in ["b", "c", "d"] {
            store
                .register_instance(name, "host-2", 1, T0, None)
                .await
                .unwrap();
        }
        claim(&store, 10, "a", T0).await;
        claim(&store, 11, "c", T0).await;
        let lost = claim(&store, 12, "d", T0).await;
        claim(&store, 12, "c", T0 + TIMEOUT + 1).await;
        store
            .execute_sql("UPDATE instances SET heartbeat_at = 0 WHERE id IN ('a', 'b', 'd')")
            .await
            .unwrap();
        assert!(store.heartbeat("c", T0).await.unwrap().is_some());
        // The taker closed what d left open, so only a is left to take over.
        let closed = store.execution(lost.execution.id).await.unwrap().unwrap();
        assert_eq!(closed.status, ExecutionStatus::Failed);
        let error = closed.error.unwrap_or_default();
        assert!(
            error.starts_with("lock_lost") && error.contains("taken over by c"),
            "{error}"
        );
        assert_eq!(store.stale_owners(60_000).await.unwrap(), ["a"]);
        // A negative silence counts everyone who holds something.
        assert_eq!(store.stale_owners(-1).await.unwrap(), ["a", "c"]);

        // Listed stale, then back before the takeover ran: the takeover
        // checks again in its own transaction and leaves a's work alone.
        assert!(store.heartbeat("a", T0).await.unwrap().is_some());
        assert_eq!(
            store
                .recover_silent_owner("a", 60_000, T0 + TIMEOUT + 100)
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            store.stale_owners(-1).await.unwrap(),
            ["a", "c"],
            "a keeps its lock"
        );
        store
            .execute_sql("UPDATE instances SET heartbeat_at = 0 WHERE id = 'a'")
            .await
            .unwrap();
        let failed = store
            .recover_silent_owner("a", 60_000, T0 + TIMEOUT + 100)
            .await
            .unwrap()
            .expect("a is silent again: taken over");
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(store.stale_owners(60_000).await.unwrap().is_empty());
    }
);

// ---- batcher -----------------------------------------------------------------

/// The writer's commits reach the database file itself, not only its WAL,
/// while the store is open: the checkpointer beside the writer copies
/// them. The writer's own checkpoint threshold (16,000 pages) is far off,
/// and nothing else writes, so without it the claim would stay in the WAL
/// until the last connection closed. `immutable` reads the file alone,
/// ignoring the WAL, on a connection of its own.
#[tokio::test]
async fn the_writers_commits_are_checkpointed_into_the_database_file() {
    use sqlx::ConnectOptions;
    use std::str::FromStr;

    let db = common::sqlite_db().await;
    let store = store_with_rules(&db, [20]).await;
    let batcher = TransitionBatcher::new(store.clone());
    let claim = batcher
        .claim(&request(20, HOLDER, T0))
        .await
        .unwrap()
        .expect("claimed");

    let file_only = sqlx::sqlite::SqliteConnectOptions::from_str(&db.url)
        .unwrap()
        .read_only(true)
        .immutable(true);
    let execution_id = claim.execution.id.to_string();
    common::eventually(
        Duration::from_secs(10),
        "the claimed execution in the database file",
        || async {
            // A fresh connection each time: an immutable one may cache pages.
            let mut conn = file_only.connect().await.unwrap();
            // Until the first checkpoint the file may not hold even the
            // tables: the migrations are in the WAL too.
            let in_file: Option<i64> =
                sqlx::query_scalar("SELECT count(*) FROM executions WHERE id = $1")
                    .bind(&execution_id)
                    .fetch_one(&mut conn)
                    .await
                    .ok();
            in_file == Some(1)
        },
    )
    .await;
    drop(batcher);
    store.close().await;
}

/// PostgreSQL's writer finds every row it writes by key, also on a young
/// database. sqlx prepares each statement once per connection, and after
/// five runs PostgreSQL keeps a generic plan costed on the tables as they
/// were then: before autovacuum had analyzed them, an empty `executions`
/// was sized at the planner's floor of ten pages, the kept plan scanned
/// it, and every Scheduled and finish of a burst read the whole table.
/// Twelve jobs run through the batcher (Scheduled and Running queued
/// together, so they usually share an update), and the table statistics,
/// flushed when the writer's session ends, must show no sequential scan of
/// `executions` or `branch_rules`.
#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_writer_finds_its_rows_by_key_on_a_young_database() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    let rules = 100..112;
    store_with_rules(&db, rules.clone()).await.close().await;
    let before = table_scans(&db).await;

    let store = db.store().await;
    let batcher = TransitionBatcher::new(store.clone());
    for (n, now) in rules.zip((T0..).step_by(10)) {
        let fence = batcher
            .claim(&request(n, HOLDER, now))
            .await
            .unwrap()
            .expect("claimed")
            .fence();
        let (scheduled, running) = tokio::join!(
            batcher.mark_scheduled(&fence, now + 1),
            batcher.mark_running(&fence, now + 2)
        );
        assert!(scheduled.unwrap() && running.unwrap(), "rule {n} started");
        let finish = completed(now + 3, Some(now + 86_400_000));
        batcher
            .finish(&fence, &finish)
            .await
            .unwrap()
            .expect("finished");
    }
    drop(batcher);
    store.close().await;
    let after = table_scans(&db).await;

    assert!(
        after.index_scans > before.index_scans,
        "the writer's work is in the statistics: {before:?} → {after:?}"
    );
    assert_eq!(
        after.sequential_scans, before.sequential_scans,
        "the writer scanned a table: {before:?} → {after:?}"
    );
}

/// PostgreSQL's writer runs a transaction per lane at once, each lane
/// holding the transitions of its own branch rules. A write that waits on a
/// row lock (an operator's open transaction on the rule, say) holds up its
/// lane only: other rules' claims commit meanwhile, and the waiting rule's
/// own later transitions stay behind it, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_write_waiting_on_a_row_lock_holds_up_only_its_own_lane() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    let blocked = 300;
    // Sixteen rules: some share rule 300's lane, the others do not.
    let others = 301..317;
    let store = store_with_rules(&db, std::iter::once(blocked).chain(others.clone())).await;
    let batcher = TransitionBatcher::new(store.clone());
    let fence = batcher
        .claim(&request(blocked, HOLDER, T0))
        .await
        .unwrap()
        .expect("claimed")
        .fence();

    let operator = own_pool(&db).await;
    let operator_tx = hold_row_lock(&operator, blocked).await;

    // The finish waits on the operator's row lock; the claim of the same
    // rule, queued right behind it, must wait for it.
    let finish = batcher
        .queue_finish(&fence, &completed(T0 + 10, Some(T0 + 20)))
        .await;
    let reclaim = batcher
        .enqueue(Transition::Claim(request(blocked, HOLDER, T0 + 30)))
        .await;
    let finish = tokio::spawn(finish.finished());
    let reclaim = tokio::spawn(reclaim.outcome());

    let (first, mut claims) = claims_until_one_commits(&batcher, others, T0).await;
    assert!(first.unwrap().is_some(), "that claim took its rule");
    assert!(
        !finish.is_finished() && !reclaim.is_finished(),
        "the rule behind the row lock wrote nothing yet, and nothing of it overtook"
    );

    operator_tx.commit().await.unwrap();
    let row = finish
        .await
        .unwrap()
        .unwrap()
        .expect("the finish released the rule");
    assert_eq!(row.lock_holder, None);
    assert_eq!(row.next_run_time, Some(T0 + 20));
    match reclaim.await.unwrap().unwrap() {
        TransitionOutcome::Claimed(Some(claim)) => {
            assert_eq!(
                claim.branch_rule.lock_epoch,
                fence.epoch + 1,
                "claimed after the finish"
            )
        }
        other => panic!("the claim queued behind the finish: {other:?}"),
    }
    while let Some(claim) = claims.join_next().await {
        assert!(
            claim.unwrap().unwrap().is_some(),
            "every other rule was claimed"
        );
    }
    operator.close().await;
}

/// A barrier returns only once every lane has run what was queued before
/// it, whichever lane that is in. A restarted master recovers its
/// predecessor's jobs after the barrier, so a finish still queued on any
/// lane must land first, or the job would be recorded lost and run again.
#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_barrier_waits_for_every_lane() {
    let Some(db) = common::postgres_db().await else {
        return;
    };
    // Rules of every lane among the blocked ones, whatever the hash.
    let blocked = 400..404;
    let others = 410..426;
    let store = store_with_rules(&db, blocked.clone().chain(others.clone())).await;
    let batcher = TransitionBatcher::new(store.clone());
    let operator = own_pool(&db).await;
    for (round, n) in blocked.enumerate() {
        let now = T0 + 1_000 * round as Millis;
        let fence = batcher
            .claim(&request(n, HOLDER, now))
            .await
            .unwrap()
            .expect("claimed")
            .fence();
        let operator_tx = hold_row_lock(&operator, n).await;
        let finish = batcher
            .queue_finish(&fence, &completed(now + 10, Some(now + 86_400_000)))
            .await;
        let finish = tokio::spawn(finish.finished());
        let mut barrier = std::pin::pin!(batcher.barrier(HOLDER, now + 20));
        assert!(
            poll_once(barrier.as_mut()).await.is_pending(),
            "rule {n}: the barrier waits behind the finish"
        );

        // A claim queued after the barrier commits on another lane; the
        // barrier went through that lane before it, but not through rule
        // n's, which the operator holds up.
        let (first, mut claims) = claims_until_one_commits(&batcher, others.clone(), now).await;
        first.unwrap();
        assert!(
            poll_once(barrier.as_mut()).await.is_pending(),
            "rule {n}: the barrier returned while its finish was still queued"
        );

        operator_tx.commit().await.unwrap();
        barrier.await;
        assert_eq!(
            rule(&store, n).await.lock_holder,
            None,
            "rule {n}: its finish committed before the barrier returned"
        );
        assert!(finish.await.unwrap().unwrap().is_some());
        while let Some(claim) = claims.join_next().await {
            claim.unwrap().unwrap();
        }
    }
    operator.close().await;
}

/// One connection of the test's own, beside the store's (an operator's
/// `psql`, say).
async fn own_pool(db: &TestDb) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap()
}

/// An open transaction holding branch rule `n`'s row lock until it ends.
async fn hold_row_lock(
    operator: &sqlx::PgPool,
    n: u32,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = operator.begin().await.unwrap();
    sqlx::query("SELECT id FROM branch_rules WHERE id = $1 FOR UPDATE")
        .bind(id(n).to_string())
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

type ClaimOutcome = Result<Option<Claim>, ruled::store::BatchError>;

/// Claims of the rules `ns` through the batcher, a task each: the first
/// to commit, and the others still running. Panics when none commits
/// within 30 s (a lane held up by a row lock holds up only its own rules).
async fn claims_until_one_commits(
    batcher: &TransitionBatcher,
    ns: std::ops::Range<u32>,
    now: Millis,
) -> (ClaimOutcome, tokio::task::JoinSet<ClaimOutcome>) {
    let mut claims = tokio::task::JoinSet::new();
    for n in ns {
        let batcher = batcher.clone();
        claims.spawn(async move { batcher.claim(&request(n, HOLDER, now)).await });
    }
    let first = tokio::time::timeout(Duration::from_secs(30), claims.join_next())
        .await
        .expect("a rule's claim committed while another rule's write waited on a row lock")
        .expect("a claim ran")
        .unwrap();
    (first, claims)
}

/// Polls `future` once: whether it is done yet, without waiting for it.
async fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
    let mut future = future;
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await
}

/// Scans of `executions` and `branch_rules` so far, read once every other
/// session on the database has ended (a session's counts reach the
/// statistics when it ends, at the latest).
#[derive(Debug, Clone, Copy)]
struct TableScans {
    sequential_scans: i64,
    index_scans: i64,
}

async fn table_scans(db: &TestDb) -> TableScans {
    let pool = own_pool(db).await;
    common::eventually(
        Duration::from_secs(10),
        "every other session on the test database ended",
        || async {
            let others: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            others == 0
        },
    )
    .await;
    let (sequential_scans, index_scans): (i64, i64) = sqlx::query_as(
        "SELECT COALESCE(sum(seq_scan), 0)::int8, COALESCE(sum(idx_scan), 0)::int8 \
         FROM pg_stat_user_tables WHERE relname IN ('executions', 'branch_rules')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    TableScans {
        sequential_scans,
        index_scans,
    }
}

both_backends!(
    the_batcher_answers_each_caller_with_its_own_result,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10, 11, 12, 13]).await;
        let batcher = TransitionBatcher::new(store.clone());

        // Claims through the batcher, all queued before the task runs.
        let claims = join_all([10, 11, 12, 10].map(|n| {
            let batcher = batcher.clone();
            async move { batcher.claim(&request(n, HOLDER, T0)).await.unwrap() }
        }))
        .await;
        let won: Vec<bool> = claims.iter().map(Option::is_some).collect();
        assert_eq!(won, [true, true, true, false], "rule 10 is claimed once");
        let fences: Vec<Fence> = claims.iter().flatten().map(Claim::fence).collect();

        // One batch: a stale fence next to good ones.
        let stale = Fence {
            epoch: 99,
            ..fences[1].clone()
        };
        let results = join_all([
            batcher.mark_scheduled(&fences[0], T0 + 1),
            batcher.mark_scheduled(&stale, T0 + 1),
            batcher.mark_scheduled(&fences[1], T0 + 1),
            batcher.mark_scheduled(&fences[2], T0 + 1),
        ])
        .await;
        let results: Vec<bool> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(results, [true, false, true, true]);

        // An item that fails after others have written: it alone gets the
        // error, the others are re-run and land.
        let bad = Finish {
            status: ExecutionStatus::Running,
            ..completed(T0 + 2, None)
        };
        let (one, two, three) = tokio::join!(
            batcher.mark_running(&fences[0], T0 + 2),
            batcher.finish(&fences[1], &bad),
            batcher.mark_running(&fences[2], T0 + 2),
        );
        assert!(one.unwrap());
        assert!(two.unwrap_err().to_string().contains("not terminal"));
        assert!(three.unwrap());

        // A database error inside a claim (its execution id is taken, after the
        // branch rule UPDATE matched) rolls that claim back, and only that one.
        let mut clash = request(13, HOLDER, T0);
        clash.execution_id = fences[0].execution_id;
        let done = completed(T0 + 3, Some(T0 + 86_400_000));
        let (clashed, finished, renewed) = tokio::join!(
            batcher.claim(&clash),
            batcher.finish(&fences[0], &done),
            batcher.renew_lock(&fences[2], T0 + 3),
        );
        let error = clashed.unwrap_err();
        assert!(error.is_unique_violation(), "{error}");
        let row = finished.unwrap().expect("the owner finishes");
        assert_eq!(row, rule(&store, 10).await);
        assert!(renewed.unwrap());
        let untouched = rule(&store, 13).await;
        assert_eq!(
            (untouched.lock_holder, untouched.lock_epoch),
            (None, 0),
            "the failed claim was rolled back"
        );

        // The same results through `submit` and unbatched `Store::apply`.
        let transition = Transition::Running {
            fence: fences[1].clone(),
            now: T0 + 4,
        };
        assert_eq!(
            batcher.submit(transition.clone()).await.unwrap(),
            TransitionOutcome::Applied(true)
        );
        assert_eq!(
            store.apply(&transition).await.unwrap(),
            TransitionOutcome::Applied(false)
        );

        let e = execution(&store, fences[0].execution_id).await;
        assert_eq!(
            (e.status, e.scheduled_at, e.started_at, e.finished_at),
            (
                ExecutionStatus::Completed,
                Some(T0 + 1),
                Some(T0 + 2),
                Some(T0 + 3)
            )
        );
    }
);

both_backends!(
    the_batcher_answers_large_mixed_batches_one_by_one_semantics,
    |db: TestDb| async move {
        let rules: Vec<u32> = (100..120).collect();
        let store = store_with_rules(&db, rules.clone()).await;
        let batcher = TransitionBatcher::new(store.clone());

        // Twenty claims and two repeats in one batch: a repeat loses.
        let requests: Vec<ClaimRequest> = rules
            .iter()
            .chain(&[100, 101])
            .map(|&n| request(n, HOLDER, T0))
            .collect();
        let claims = join_all(requests.iter().map(|req| batcher.claim(req))).await;
        let claims: Vec<Option<Claim>> = claims.into_iter().map(Result::unwrap).collect();
        assert!(claims[..20].iter().all(Option::is_some));
        assert!(claims[20..].iter().all(Option::is_none));
        let fences: Vec<Fence> = claims[..20].iter().flatten().map(Claim::fence).collect();
        for (claim, req) in claims.iter().flatten().zip(&requests) {
            assert_eq!(claim.execution.id, req.execution_id);
            assert_eq!(
                (claim.execution.attempt, claim.branch_rule.lock_epoch),
                (1, 1)
            );
            assert_eq!(claim.branch_rule, rule(&store, req_n(req)).await);
        }

        // Every fourth with a stale epoch; every fifth also renews its lock
        // in the same batch (a second transition of the same rule).
        let mut transitions = Vec::new();
        let mut expected = Vec::new();
        for (i, fence) in fences.iter().enumerate() {
            if i % 4 == 0 {
                let stale = Fence {
                    epoch: 2,
                    ..fence.clone()
                };
                transitions.push(Transition::Scheduled {
                    fence: stale,
                    now: T0 + 1,
                });
                expected.push(TransitionOutcome::Applied(false));
            } else {
                transitions.push(Transition::Scheduled {
                    fence: fence.clone(),
                    now: T0 + 1,
                });
                expected.push(TransitionOutcome::Applied(true));
            }
            if i % 5 == 0 {
                transitions.push(Transition::RenewLock {
                    fence: fence.clone(),
                    now: T0 + 2,
                });
                expected.push(TransitionOutcome::Applied(true));
            }
        }
        let outcomes = join_all(transitions.iter().map(|t| batcher.submit(t.clone()))).await;
        let outcomes: Vec<TransitionOutcome> = outcomes.into_iter().map(Result::unwrap).collect();
        assert_eq!(outcomes, expected);

        let running = join_all(fences.iter().map(|f| batcher.mark_running(f, T0 + 3))).await;
        let running: Vec<bool> = running.into_iter().map(Result::unwrap).collect();
        let expected: Vec<bool> = (0..20).map(|i| i % 4 != 0).collect();
        assert_eq!(running, expected, "the never-scheduled ones cannot run");

        // Everyone finishes; a stale twin of the first finish comes after it.
        let finish = completed(T0 + 10, Some(T0 + 86_400_000));
        let wrong_holder = Fence {
            holder: OTHER.into(),
            ..fences[0].clone()
        };
        let mut finishes: Vec<(Fence, Finish)> =
            fences.iter().map(|f| (f.clone(), finish.clone())).collect();
        finishes.push((wrong_holder, finish.clone()));
        let rows = join_all(finishes.iter().map(|(f, fin)| batcher.finish(f, fin))).await;
        let rows: Vec<Option<BranchRule>> = rows.into_iter().map(Result::unwrap).collect();
        assert_eq!(rows[20], None, "the stale finish changes nothing");
        for (row, &n) in rows[..20].iter().zip(&rules) {
            let row = row.as_ref().expect("the owner finishes");
            assert_eq!(*row, rule(&store, n).await);
            assert_eq!(
                (row.lock_holder.as_deref(), row.next_run_time),
                (None, Some(T0 + 86_400_000))
            );
            assert_eq!(row.last_run_time, Some(T0 + 10));
        }
        for (i, fence) in fences.iter().enumerate() {
            let e = execution(&store, fence.execution_id).await;
            assert_eq!(e.status, ExecutionStatus::Completed);
            assert_eq!(
                e.started_at,
                (i % 4 != 0).then_some(T0 + 3),
                "execution {i}"
            );
            assert_eq!(e.output, Some(json!({"ok": true})));
        }
    }
);

fn req_n(req: &ClaimRequest) -> u32 {
    (100..120).find(|&n| id(n) == req.branch_rule_id).unwrap()
}

both_backends!(
    the_batcher_lets_the_store_close_and_then_reports_errors,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [10]).await;
        let won = claim(&store, 10, HOLDER, T0).await;
        let fence = won.fence();
        let batcher = TransitionBatcher::new(store.clone());
        // The batcher now keeps a connection between batches...
        assert!(batcher.mark_scheduled(&fence, T0 + 1).await.unwrap());
        // ...which must not keep the store from closing.
        tokio::time::timeout(Duration::from_secs(10), store.close())
            .await
            .expect("Store::close returns while a batcher is alive");
        let (one, two) = tokio::join!(
            batcher.mark_running(&fence, T0 + 2),
            batcher.renew_lock(&fence, T0 + 2),
        );
        for result in [one.map(drop), two.map(drop)] {
            let error = result.unwrap_err();
            assert!(error.is_transient(), "{error}");
        }
    }
);

both_backends!(
    transitions_enqueued_back_to_back_commit_in_order,
    |db: TestDb| async move {
        let store = store_with_rules(&db, [20, 21]).await;
        let batcher = TransitionBatcher::new(store.clone());
        let live = batcher
            .claim(&request(20, HOLDER, T0))
            .await
            .unwrap()
            .unwrap();
        let lost = batcher
            .claim(&request(21, HOLDER, T0))
            .await
            .unwrap()
            .unwrap();
        let lost_fence = Fence {
            epoch: 99,
            ..lost.fence()
        };

        // Running is queued before Scheduled has committed: it applies only
        // because the batcher keeps their order, and only if Scheduled did.
        let mut pending = Vec::new();
        for fence in [live.fence(), lost_fence] {
            let scheduled = Transition::Scheduled {
                fence: fence.clone(),
                now: T0 + 1,
            };
            let running = Transition::Running { fence, now: T0 + 2 };
            pending.push(batcher.enqueue(scheduled).await);
            pending.push(batcher.enqueue(running).await);
        }
        let mut applied = Vec::new();
        for transition in pending {
            applied.push(transition.applied().await.unwrap());
        }
        assert_eq!(applied, [true, true, false, false]);
        let row = execution(&store, live.execution.id).await;
        assert_eq!(row.status, ExecutionStatus::Running);
        assert_eq!(
            (row.scheduled_at, row.started_at),
            (Some(T0 + 1), Some(T0 + 2))
        );
        assert_eq!(
            execution(&store, lost.execution.id).await.status,
            ExecutionStatus::Requested
        );
    }
);

/// `join_all` without the `futures` dependency. Every future is polled in
/// order within one poll, so all submit before the batcher task can run and
/// they share a batch.
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

// ---- throughput --------------------------------------------------------------

/// Claims, schedules, runs and finishes JOBS jobs through the batcher from
/// TASKS concurrent tasks on a SQLite file database (WAL), and prints jobs/s,
/// then the latency of a lone caller. A report, not a test of speed: run it
/// in release with
/// `cargo test --release --test store_executions throughput_report -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement; run explicitly in release"]
async fn throughput_report() {
    let db = common::sqlite_db().await;
    report(&db, "SQLite WAL").await;
}

/// The same on PostgreSQL, for comparison.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement; run explicitly in release"]
async fn postgres_throughput() {
    if let Some(db) = common::postgres_db().await {
        report(&db, "PostgreSQL").await;
    }
}

async fn report(db: &TestDb, label: &str) {
    const JOBS: usize = 10_000;
    const TASKS: usize = 50;
    const LONE_JOBS: usize = 200;
    let store = db.store().await;
    seed(&store).await;
    let mut rules: Vec<Uuid> = (0..JOBS + LONE_JOBS).map(|_| Uuid::new_v4()).collect();
    for &rule_id in &rules {
        let row = BranchRule {
            id: rule_id,
            ..branch_rule(0, Some(T0))
        };
        store.insert_branch_rule(&row).await.unwrap();
    }
    let batcher = TransitionBatcher::new(store.clone());
    let clock = Arc::new(AtomicUsize::new(0));
    let now = move || T0 + clock.fetch_add(1, Ordering::Relaxed) as Millis;

    let lone = rules.split_off(JOBS);
    let rules = Arc::new(rules);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (batcher, rules, next, now) =
            (batcher.clone(), rules.clone(), next.clone(), now.clone());
        tasks.push(tokio::spawn(async move {
            let holder = format!("bench-{}", task % 4);
            while let Some(&rule_id) = rules.get(next.fetch_add(1, Ordering::Relaxed)) {
                run_job(&batcher, rule_id, &holder, &now).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();

    let started = Instant::now();
    for &rule_id in &lone {
        run_job(&batcher, rule_id, "lone", &now).await;
    }
    let lone_latency = started.elapsed() / (LONE_JOBS as u32 * 4);
    drop(batcher);

    let counts = store.count_executions_by_status().await.unwrap();
    let completed_count = counts
        .iter()
        .find(|(s, _)| *s == ExecutionStatus::Completed)
        .unwrap()
        .1;
    assert_eq!(
        completed_count,
        (JOBS + LONE_JOBS) as i64,
        "every job recorded"
    );
    let jobs_per_second = JOBS as f64 / elapsed.as_secs_f64();
    println!(
        "throughput_report: {JOBS} jobs x 4 transitions, {TASKS} tasks, {label}: \
         {elapsed:.2?} -> {jobs_per_second:.0} jobs/s ({:.0} transitions/s); \
         a lone caller waits {lone_latency:.0?} per transition",
        jobs_per_second * 4.0
    );
    store.close().await;
}

/// One job's four transitions, each through the batcher.
async fn run_job(
    batcher: &TransitionBatcher,
    rule_id: Uuid,
    holder: &str,
    now: &impl Fn() -> Millis,
) {
    let req = ClaimRequest {
        branch_rule_id: rule_id,
        holder: holder.into(),
        now: now(),
        lock_timeout_ms: TIMEOUT,
        execution_id: Uuid::new_v4(),
        run_now: false,
        due_by: None,
    };
    let fence = batcher.claim(&req).await.unwrap().expect("claimed").fence();
    assert!(batcher.mark_scheduled(&fence, now()).await.unwrap());
    assert!(batcher.mark_running(&fence, now()).await.unwrap());
    let at = now();
    let finish = completed(at, Some(at + 86_400_000));
    batcher
        .finish(&fence, &finish)
        .await
        .unwrap()
        .expect("finished");
}
