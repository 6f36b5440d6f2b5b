//! Several instances on one database (DESIGN §4, seed 003): the pure
//! verdicts. No I/O here; the [`LeaseActor`](crate::actors::lease) runs
//! them against what the database says and acts on the answer.
//!
//! - [`partition_of`]: a rule's partition, a stable hash of its id.
//! - [`Ownership`]: which partitions this instance may claim rules of.
//! - [`desired_owners`] and [`lease_moves`]: who should hold each partition
//!   lease, and what this instance must release or acquire to get there.
//! - [`instance_id_verdict`], [`is_silent`], [`must_self_fence`]: whether a
//!   start may take an INSTANCE_ID, when a peer counts as dead, and when an
//!   instance must assume its own leases are gone.

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use crate::config::Partition;
use crate::model::Millis;

/// A rule's partition: FNV-1a over the id's 16 bytes, modulo `count`. The
/// bytes and the arithmetic are fixed, so every instance on every platform
/// agrees, and ids that share a prefix or a suffix still spread evenly.
pub fn partition_of(id: &Uuid, count: u32) -> u32 {
    (stable_hash(id) % u64::from(count.max(1))) as u32
}

/// FNV-1a (64-bit) of the id's bytes: stable across runs, hosts and
/// versions, unlike `std`'s randomly seeded hasher.
pub fn stable_hash(id: &Uuid) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    id.as_bytes().iter().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

/// Which rules this instance may claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Ownership {
    /// Every rule: the single instance of an SQLite database.
    All,
    /// The rules of the partitions whose lease this instance holds.
    Partitions { count: u32, held: Vec<u32> },
}

impl Ownership {
    /// Holds no partition: claims nothing (before the first lease, or
    /// after the leases were lost).
    pub fn none(count: u32) -> Ownership {
        Ownership::Partitions {
            count,
            held: Vec::new(),
        }
    }

    pub fn owns(&self, id: &Uuid) -> bool {
        match self {
            Ownership::All => true,
            Ownership::Partitions { count, held } => {
                held.binary_search(&partition_of(id, *count)).is_ok()
            }
        }
    }

    /// How many partitions are held (`None`: all rules, no partitions).
    pub fn held_count(&self) -> Option<usize> {
        match self {
            Ownership::All => None,
            Ownership::Partitions { held, .. } => Some(held.len()),
        }
    }
}

/// A live instance as the lease verdict sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveInstance {
    pub id: String,
    /// Its static PARTITION=k/N, if it has one.
    pub preferred: Option<Partition>,
}

/// The partitions a static PARTITION=k/N prefers: every `p` with
/// `p mod N = k`.
pub fn prefers(partition: Partition, p: u32) -> bool {
    p % partition.count == partition.index
}

/// Who should hold each partition's lease, by index: a deterministic
/// function of the live set, so every instance that sees the same set
/// computes the same answer and the cluster converges without talking.
///
/// - A partition some live static instance prefers goes to it (the
///   lowest id among several).
/// - The rest are dealt round-robin to the live instances without a static
///   partition, sorted by id, so each holds its fair share (they differ by
///   at most one).
/// - With no such instance, the rest are dealt round-robin to all live
///   instances: a partition is never left unowned while any instance lives.
///
/// `live` need not be sorted; an empty `live` gives no owners.
pub fn desired_owners(live: &[LiveInstance], count: u32) -> Vec<Option<&str>> {
    let mut sorted: Vec<&LiveInstance> = live.iter().collect();
    sorted.sort_by(|a, b| a.id.cmp(&b.id));
    sorted.dedup_by(|a, b| a.id == b.id);
    let dynamic: Vec<&str> = sorted
        .iter()
        .filter(|i| i.preferred.is_none())
        .map(|i| i.id.as_str())
        .collect();
    let everyone: Vec<&str> = sorted.iter().map(|i| i.id.as_str()).collect();
    let dealers = if dynamic.is_empty() {
        &everyone
    } else {
        &dynamic
    };
    let mut dealt = 0usize;
    (0..count)
        .map(|p| {
            let preferred = sorted
                .iter()
                .find(|i| i.preferred.is_some_and(|k| prefers(k, p)));
            if let Some(owner) = preferred {
                return Some(owner.id.as_str());
            }
            if dealers.is_empty() {
                return None;
            }
            let owner = dealers[dealt % dealers.len()];
            dealt += 1;
            Some(owner)
        })
        .collect()
}

/// One row of `partition_leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseRow {
    pub partition: u32,
    pub holder: Option<String>,
    pub epoch: i64,
    /// Epoch ms on the database's clock.
    pub expires_at: Millis,
}

impl LeaseRow {
    /// The holder, while the lease runs at `db_now`.
    pub fn live_holder(&self, db_now: Millis) -> Option<&str> {
        self.holder.as_deref().filter(|_| self.expires_at > db_now)
    }
}

/// What one instance does to its leases this round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseMoves {
    /// Held and still wanted: renew.
    pub keep: Vec<u32>,
    /// Held but wanted by another live instance: give back.
    pub release: Vec<u32>,
    /// Wanted here and free (never held, released, or expired): take.
    pub acquire: Vec<u32>,
}

/// Compares the leases with [`desired_owners`] from `me`'s point of view.
/// A partition another instance still holds is never taken, even when it
/// is desired here: its holder gives it back at its next renewal, or its
/// lease runs out.
pub fn lease_moves(
    me: &str,
    desired: &[Option<&str>],
    leases: &[LeaseRow],
    db_now: Millis,
) -> LeaseMoves {
    let mut moves = LeaseMoves::default();
    for (p, owner) in desired.iter().enumerate() {
        let p = p as u32;
        let holder = leases
            .iter()
            .find(|row| row.partition == p)
            .and_then(|row| row.live_holder(db_now));
        let wanted_here = *owner == Some(me);
        match holder {
            Some(h) if h == me && wanted_here => moves.keep.push(p),
            Some(h) if h == me => moves.release.push(p),
            Some(_) => {}
            None if wanted_here => moves.acquire.push(p),
            None => {}
        }
    }
    moves
}

/// Which instance holds each partition's lease at one moment, to say who
/// runs a rule (`ruled plan`, `GET /api/v1/plan`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOwners {
    pub count: u32,
    /// By partition; `None` for a partition nobody holds now.
    pub owners: Vec<Option<String>>,
}

impl PartitionOwners {
    /// One instance holding everything (SQLite).
    pub fn single(count: u32, instance_id: &str) -> PartitionOwners {
        PartitionOwners {
            count,
            owners: vec![Some(instance_id.to_string()); count as usize],
        }
    }

    /// The rule's partition and the instance holding it (`None`: nobody
    /// holds it, so nobody claims the rule until someone does).
    pub fn of(&self, id: &Uuid) -> (u32, Option<&str>) {
        let partition = partition_of(id, self.count);
        let owner = self
            .owners
            .get(partition as usize)
            .and_then(|owner| owner.as_deref());
        (partition, owner)
    }
}

/// What the `instances` row of this INSTANCE_ID says about a start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceIdVerdict {
    /// No row, or a silent one: take the id.
    Free,
    /// A fresh heartbeat from a process on this host that no longer runs:
    /// a crashed predecessor; take the id and recover its work at once.
    CrashedPredecessor { pid: i64 },
    /// Another live process holds the id: refuse to start.
    InUse {
        hostname: String,
        pid: i64,
        seconds_ago: i64,
    },
}

/// The row of this INSTANCE_ID, as the verdicts need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSeen {
    pub hostname: String,
    pub pid: i64,
    pub heartbeat_at: Millis,
}

/// DESIGN §3: a fresh heartbeat under our id is a crashed predecessor when
/// it came from this host and its pid no longer runs; otherwise another
/// live process holds the id. `pid_alive` is asked only for this host.
pub fn instance_id_verdict(
    row: Option<&InstanceSeen>,
    my_hostname: &str,
    my_pid: i64,
    db_now: Millis,
    silence: Duration,
    pid_alive: impl Fn(i64) -> bool,
) -> InstanceIdVerdict {
    let Some(row) = row else {
        return InstanceIdVerdict::Free;
    };
    if is_silent(row.heartbeat_at, db_now, silence) {
        return InstanceIdVerdict::Free;
    }
    let same_host = row.hostname == my_hostname;
    if same_host && (row.pid == my_pid || !pid_alive(row.pid)) {
        return InstanceIdVerdict::CrashedPredecessor { pid: row.pid };
    }
    InstanceIdVerdict::InUse {
        hostname: row.hostname.clone(),
        pid: row.pid,
        seconds_ago: (db_now - row.heartbeat_at) / 1000,
    }
}

/// A peer whose last heartbeat (database time) is older than `silence`
/// (PARTITION_LEASE_TTL_SECONDS) is dead: its claims are taken over.
pub fn is_silent(heartbeat_at: Millis, db_now: Millis, silence: Duration) -> bool {
    db_now - heartbeat_at > silence.as_millis() as Millis
}

/// How long before its peers may call it silent an instance stops its own
/// jobs: the kill of an action's process group and the drop of an HTTP
/// request need a moment, and they must be over before a peer runs the
/// occurrence again.
pub fn self_fence_margin(ttl: Duration) -> Duration {
    (ttl / 6).min(Duration::from_secs(5))
}

/// Whether an instance whose last successful heartbeat was *sent* at
/// `last_ok_sent` (its own monotonic time, ms) must assume at `now` that
/// its peers may take it over: a peer's verdict needs the database's clock
/// past the heartbeat plus the TTL, and the heartbeat was written no
/// earlier than it was sent.
pub fn must_self_fence(last_ok_sent: Millis, now: Millis, ttl: Duration) -> bool {
    now >= self_fence_deadline(last_ok_sent, ttl)
}

/// The time from which [`must_self_fence`] holds.
pub fn self_fence_deadline(last_ok_sent: Millis, ttl: Duration) -> Millis {
    last_ok_sent + (ttl - self_fence_margin(ttl)).as_millis() as Millis
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(ids: &[&str]) -> Vec<LiveInstance> {
        ids.iter()
            .map(|id| LiveInstance {
                id: id.to_string(),
                preferred: None,
            })
            .collect()
    }

    fn lease(p: u32, holder: Option<&str>, expires_at: Millis) -> LeaseRow {
        LeaseRow {
            partition: p,
            holder: holder.map(str::to_string),
            epoch: 1,
            expires_at,
        }
    }

    #[test]
    fn the_hash_is_fixed() {
        // Pinned values: a change here moves every rule to another partition
        // on upgrade, which must be a deliberate decision.
        let id = Uuid::parse_str("de300000-0000-4000-8000-000000000001").unwrap();
        assert_eq!(stable_hash(&id), 0x3f9c_8016_ea75_7258);
        assert_eq!(partition_of(&id, 64), 24);
        assert_eq!(partition_of(&Uuid::nil(), 1), 0);
    }

    #[test]
    fn sequential_ids_spread_evenly() {
        let mut counts = vec![0u32; 64];
        for n in 0..64_000u128 {
            counts[partition_of(&Uuid::from_u128(n), 64) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min > 800 && *max < 1200, "uneven: {min}..{max}");
    }

    #[test]
    fn partitions_are_dealt_fairly_and_identically_everywhere() {
        let (first, second) = (live(&["b", "a", "c"]), live(&["c", "b", "a"]));
        let a = desired_owners(&first, 64);
        let b = desired_owners(&second, 64);
        assert_eq!(a, b);
        for id in ["a", "b", "c"] {
            let n = a.iter().filter(|o| **o == Some(id)).count();
            assert!((21..=22).contains(&n), "{id} holds {n}");
        }
        assert!(desired_owners(&[], 4).iter().all(Option::is_none));
    }

    #[test]
    fn static_partitions_win_and_orphans_are_still_covered() {
        let zero_of_two = Partition { index: 0, count: 2 };
        let only_static = vec![LiveInstance {
            id: "s".into(),
            preferred: Some(zero_of_two),
        }];
        // Alone, the static instance covers the partitions nobody prefers.
        let owners = desired_owners(&only_static, 4);
        assert!(owners.iter().all(|o| *o == Some("s")));
        // With a dynamic peer, the peer takes what the static one does not prefer.
        let mut mixed = only_static.clone();
        mixed.extend(live(&["d"]));
        let owners = desired_owners(&mixed, 4);
        assert_eq!(owners, vec![Some("s"), Some("d"), Some("s"), Some("d")]);
    }

    #[test]
    fn moves_keep_release_and_acquire() {
        let desired = vec![Some("a"), Some("b"), Some("a"), Some("a")];
        let leases = vec![
            lease(0, Some("a"), 2_000),
            lease(1, Some("a"), 2_000),
            lease(2, Some("b"), 2_000),
            lease(3, Some("b"), 500),
        ];
        let moves = lease_moves("a", &desired, &leases, 1_000);
        assert_eq!(moves.keep, vec![0]);
        assert_eq!(moves.release, vec![1]);
        // 2 is b's until it gives it back or it expires; 3 has expired.
        assert_eq!(moves.acquire, vec![3]);
    }

    #[test]
    fn instance_id_verdicts() {
        let ttl = Duration::from_secs(30);
        let row = InstanceSeen {
            hostname: "h".into(),
            pid: 7,
            heartbeat_at: 100_000,
        };
        let fresh = 110_000;
        assert_eq!(
            instance_id_verdict(None, "h", 1, fresh, ttl, |_| true),
            InstanceIdVerdict::Free
        );
        assert_eq!(
            instance_id_verdict(Some(&row), "h", 1, 200_000, ttl, |_| true),
            InstanceIdVerdict::Free
        );
        assert_eq!(
            instance_id_verdict(Some(&row), "h", 1, fresh, ttl, |_| false),
            InstanceIdVerdict::CrashedPredecessor { pid: 7 }
        );
        assert!(matches!(
            instance_id_verdict(Some(&row), "h", 1, fresh, ttl, |_| true),
            InstanceIdVerdict::InUse { pid: 7, .. }
        ));
        assert!(matches!(
            instance_id_verdict(Some(&row), "other", 7, fresh, ttl, |_| false),
            InstanceIdVerdict::InUse { .. }
        ));
    }

    #[test]
    fn an_instance_fences_itself_before_its_peers_may_take_over() {
        let ttl = Duration::from_secs(30);
        assert!(!must_self_fence(0, 24_999, ttl));
        assert!(must_self_fence(0, 25_000, ttl));
        assert!(!is_silent(0, 30_000, ttl));
        assert!(is_silent(0, 30_001, ttl));
    }

    #[test]
    fn ownership_follows_the_held_partitions() {
        let id = Uuid::from_u128(42);
        let p = partition_of(&id, 8);
        assert!(Ownership::All.owns(&id));
        assert!(!Ownership::none(8).owns(&id));
        let held = Ownership::Partitions {
            count: 8,
            held: vec![p],
        };
        assert!(held.owns(&id));
    }
}
