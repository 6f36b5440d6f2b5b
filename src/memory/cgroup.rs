//! The memory limit of this process's cgroup. In a container the kernel
//! kills at the cgroup's limit, not at the machine's RAM, so that limit is
//! what "RAM at 91%" must be measured against.
//!
//! Both hierarchies are read: cgroup v2 (`memory.max`, `memory.current`)
//! and v1 (`memory.limit_in_bytes`, `memory.usage_in_bytes`). The process's
//! cgroup comes from `/proc/self/cgroup` and where it is mounted from
//! `/proc/self/mountinfo`. Parsing is separate from reading files, so the
//! layouts of real hosts are tested as plain text.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Limits at or above this are "no limit": v1 writes a page-rounded
/// `i64::MAX` (9223372036854771712) where v2 writes "max".
const UNLIMITED_FLOOR: u64 = 1 << 62;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

impl Version {
    fn limit_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        }
    }

    fn usage_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }
    }

    /// The `memory.stat` key for page cache nobody touched lately; v1's
    /// `total_` form includes the descendants, as v2's keys always do.
    fn inactive_file_key(self) -> &'static str {
        match self {
            Version::V1 => "total_inactive_file",
            Version::V2 => "inactive_file",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Dir {
    path: PathBuf,
    version: Version,
}

/// The memory cgroup directories whose limits apply to this process: its
/// own cgroup and every ancestor up to the mount, in either hierarchy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupMemory {
    dirs: Vec<Dir>,
}

/// The tightest cgroup limit and that cgroup's usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupUsage {
    pub limit_bytes: u64,
    /// Usage less inactive page cache: the kernel drops that cache before
    /// it runs out, so counting it would throttle a container whose only
    /// "pressure" is files it once read (the kubelet's working set is
    /// computed the same way).
    pub used_bytes: u64,
}

impl CgroupMemory {
    /// Where this process's cgroups are; empty outside Linux or when
    /// `/proc` cannot be read, which means "no limit".
    pub fn of_this_process() -> CgroupMemory {
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        CgroupMemory::locate(&cgroup, &mountinfo)
    }

    /// From the text of `/proc/self/cgroup` and `/proc/self/mountinfo`.
    pub fn locate(proc_cgroup: &str, mountinfo: &str) -> CgroupMemory {
        let mut v2_path = None;
        let mut v1_path = None;
        for line in proc_cgroup.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if id == "0" && controllers.is_empty() {
                v2_path = Some(path);
            } else if controllers.split(',').any(|c| c == "memory") {
                v1_path = Some(path);
            }
        }
        let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
        let mut dirs = Vec::new();
        if let Some(path) = v1_path {
            let v1_mounts = mounts.iter().filter(|m| {
                m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == "memory")
            });
            dirs.extend(chain(path, v1_mounts, Version::V1));
        }
        if let Some(path) = v2_path {
            let v2_mounts = mounts.iter().filter(|m| m.fstype == "cgroup2");
            dirs.extend(chain(path, v2_mounts, Version::V2));
        }
        CgroupMemory { dirs }
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// Reads the limits now; `None` when no cgroup limits this process.
    pub fn usage(&self) -> Option<CgroupUsage> {
        self.usage_with(|path| std::fs::read_to_string(path).ok())
    }

    /// [`usage`](Self::usage) with the file reads supplied by the caller.
    /// A cgroup is limited by its tightest ancestor, so the smallest limit
    /// on the way up wins, with the usage of the cgroup that sets it.
    pub fn usage_with(&self, read: impl Fn(&Path) -> Option<String>) -> Option<CgroupUsage> {
        let mut tightest: Option<CgroupUsage> = None;
        for dir in &self.dirs {
            let version = dir.version;
            let Some(limit) =
                read(&dir.path.join(version.limit_file())).and_then(|text| parse_limit(&text))
            else {
                continue;
            };
            let Some(usage) = read(&dir.path.join(version.usage_file()))
                .and_then(|text| text.trim().parse::<u64>().ok())
            else {
                continue;
            };
            let inactive = read(&dir.path.join("memory.stat"))
                .and_then(|stat| stat_value(&stat, version.inactive_file_key()))
                .unwrap_or(0);
            let candidate = CgroupUsage {
                limit_bytes: limit,
                used_bytes: usage.saturating_sub(inactive),
            };
            if tightest.is_none_or(|t| candidate.limit_bytes < t.limit_bytes) {
                tightest = Some(candidate);
            }
        }
        tightest
    }
}

/// "max", an unparsable value or a huge one is no limit.
fn parse_limit(text: &str) -> Option<u64> {
    let limit: u64 = text.trim().parse().ok()?;
    (limit < UNLIMITED_FLOOR).then_some(limit)
}

fn stat_value(stat: &str, key: &str) -> Option<u64> {
    let values: HashMap<&str, &str> = stat
        .lines()
        .filter_map(|line| line.split_once(' '))
        .collect();
    values.get(key)?.trim().parse().ok()
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug)]
struct Mount {
    /// The directory of the filesystem mounted here: for a cgroup
    /// filesystem, the cgroup the mount point shows.
    root: String,
    point: PathBuf,
    fstype: String,
    super_options: String,
}

impl Mount {
    /// `36 25 0:31 / /sys/fs/cgroup rw,relatime shared:9 - cgroup2 cgroup2 rw`:
    /// a variable number of optional fields comes before the " - ".
    fn parse(line: &str) -> Option<Mount> {
        let (mount, filesystem) = line.split_once(" - ")?;
        let mut mount = mount.split(' ');
        let root = unescape(mount.nth(3)?);
        let point = PathBuf::from(unescape(mount.next()?));
        let mut filesystem = filesystem.split(' ');
        let fstype = filesystem.next()?.to_string();
        let super_options = filesystem.nth(1).unwrap_or("").to_string();
        Some(Mount {
            root,
            point,
            fstype,
            super_options,
        })
    }
}

/// The kernel writes a space in a path as `\040` (octal), and likewise
/// tab, newline and backslash.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            std::str::from_utf8(digits)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup at `path` and its ancestors, as directories under the mount
/// that shows them. A mount whose root is an ancestor of `path` shows it;
/// otherwise (a cgroup namespace whose paths do not match the host's), the
/// mount point itself is the process's cgroup as far as it can see.
fn chain<'a>(path: &str, mounts: impl Iterator<Item = &'a Mount>, version: Version) -> Vec<Dir> {
    let mounts: Vec<&Mount> = mounts.collect();
    let under = mounts.iter().find_map(|mount| {
        let relative = Path::new(path).strip_prefix(&mount.root).ok()?;
        Some((mount, relative.to_path_buf()))
    });
    let Some((mount, relative)) =
        under.or_else(|| mounts.first().map(|mount| (mount, PathBuf::new())))
    else {
        return Vec::new();
    };
    relative
        .ancestors()
        // Joining "" would add a trailing slash to the mount point.
        .map(|ancestor| Dir {
            path: if ancestor.as_os_str().is_empty() {
                mount.point.clone()
            } else {
                mount.point.join(ancestor)
            },
            version,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> + use<> {
        let map: HashMap<PathBuf, String> = entries
            .iter()
            .map(|(path, text)| (PathBuf::from(path), text.to_string()))
            .collect();
        move |path| map.get(path).cloned()
    }

    fn paths(cgroup: &CgroupMemory) -> Vec<String> {
        cgroup
            .dirs
            .iter()
            .map(|d| d.path.display().to_string())
            .collect()
    }

    /// A v1 host with a per-process memory cgroup and an unused v2
    /// hierarchy beside it (this development machine's layout).
    const HYBRID_CGROUP: &str = "9:name=systemd:/\n4:memory:/process_api/10db\n1:cpu:/\n0::/\n";
    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_reads_the_process_cgroup_and_its_ancestors() {
        let cgroup = CgroupMemory::locate(HYBRID_CGROUP, HYBRID_MOUNTS);
        assert_eq!(
            paths(&cgroup),
            [
                "/sys/fs/cgroup/memory/process_api/10db",
                "/sys/fs/cgroup/memory/process_api",
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/unified",
            ]
        );
        let m = "/sys/fs/cgroup/memory";
        // Unlimited everywhere, as v1 writes it.
        let unlimited = files(&[
            (
                &format!("{m}/process_api/10db/memory.limit_in_bytes"),
                "9223372036854771712\n",
            ),
            (
                &format!("{m}/process_api/10db/memory.usage_in_bytes"),
                "101134336\n",
            ),
            (
                &format!("{m}/memory.limit_in_bytes"),
                "9223372036854771712\n",
            ),
            (&format!("{m}/memory.usage_in_bytes"), "501134336\n"),
        ]);
        assert_eq!(cgroup.usage_with(unlimited), None);
        // A limit on the parent applies to the process too.
        let limited = files(&[
            (
                &format!("{m}/process_api/10db/memory.limit_in_bytes"),
                "9223372036854771712\n",
            ),
            (
                &format!("{m}/process_api/10db/memory.usage_in_bytes"),
                "100\n",
            ),
            (&format!("{m}/process_api/memory.limit_in_bytes"), "4000\n"),
            (&format!("{m}/process_api/memory.usage_in_bytes"), "3000\n"),
            (
                &format!("{m}/process_api/memory.stat"),
                "cache 900\ninactive_file 50\ntotal_inactive_file 1000\n",
            ),
        ]);
        assert_eq!(
            cgroup.usage_with(limited),
            Some(CgroupUsage {
                limit_bytes: 4000,
                used_bytes: 2000,
            })
        );
    }

    #[test]
    fn v2_container_with_its_own_namespace() {
        let cgroup = CgroupMemory::locate(
            "0::/\n",
            "1204 1190 0:26 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw,nsdelegate\n",
        );
        assert_eq!(paths(&cgroup), ["/sys/fs/cgroup"]);
        let read = files(&[
            ("/sys/fs/cgroup/memory.max", "2147483648\n"),
            ("/sys/fs/cgroup/memory.current", "1932735283\n"),
            (
                "/sys/fs/cgroup/memory.stat",
                "anon 1800000000\nfile 100000000\ninactive_file 32735283\n",
            ),
        ]);
        assert_eq!(
            cgroup.usage_with(read),
            Some(CgroupUsage {
                limit_bytes: 2_147_483_648,
                used_bytes: 1_900_000_000,
            })
        );
    }

    #[test]
    fn v2_the_tightest_limit_on_the_way_up_wins() {
        let cgroup = CgroupMemory::locate(
            "0::/system.slice/ruled.service\n",
            "30 1 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        assert_eq!(
            paths(&cgroup),
            [
                "/sys/fs/cgroup/system.slice/ruled.service",
                "/sys/fs/cgroup/system.slice",
                "/sys/fs/cgroup",
            ]
        );
        let read = files(&[
            (
                "/sys/fs/cgroup/system.slice/ruled.service/memory.max",
                "max\n",
            ),
            (
                "/sys/fs/cgroup/system.slice/ruled.service/memory.current",
                "10\n",
            ),
            ("/sys/fs/cgroup/system.slice/memory.max", "8000\n"),
            ("/sys/fs/cgroup/system.slice/memory.current", "6000\n"),
        ]);
        assert_eq!(
            cgroup.usage_with(read),
            Some(CgroupUsage {
                limit_bytes: 8000,
                used_bytes: 6000,
            })
        );
        let only_max = files(&[
            (
                "/sys/fs/cgroup/system.slice/ruled.service/memory.max",
                "max\n",
            ),
            (
                "/sys/fs/cgroup/system.slice/ruled.service/memory.current",
                "10\n",
            ),
        ]);
        assert_eq!(cgroup.usage_with(only_max), None);
    }

    #[test]
    fn a_mount_root_inside_the_hierarchy_is_stripped() {
        // A container without a cgroup namespace: the host's path shows,
        // and the mount's root is the container's cgroup.
        let cgroup = CgroupMemory::locate(
            "0::/docker/abc/app\n",
            "700 600 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup rw\n",
        );
        assert_eq!(paths(&cgroup), ["/sys/fs/cgroup/app", "/sys/fs/cgroup"]);
        // Paths that do not match the mount: the mount point is all we see.
        let cgroup = CgroupMemory::locate(
            "0::/elsewhere\n",
            "700 600 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup rw\n",
        );
        assert_eq!(paths(&cgroup), ["/sys/fs/cgroup"]);
    }

    #[test]
    fn nothing_to_read_means_no_limit() {
        assert!(CgroupMemory::locate("", "").is_empty());
        assert!(CgroupMemory::locate("0::/\n", HYBRID_MOUNTS.lines().next().unwrap()).is_empty());
        assert_eq!(CgroupMemory::default().usage_with(|_| None), None);
        // Garbage in the files is no limit, not a panic.
        let cgroup = CgroupMemory::locate("0::/\n", "1 0 0:1 / /cg rw - cgroup2 none rw\n");
        let read = files(&[("/cg/memory.max", "lots\n"), ("/cg/memory.current", "1\n")]);
        assert_eq!(cgroup.usage_with(read), None);
    }

    #[test]
    fn mount_fields_are_unescaped_and_optional_fields_skipped() {
        let mount = Mount::parse(
            "40 31 0:37 / /mnt/with\\040space rw,relatime shared:2 master:1 - cgroup cgroup rw,cpu,memory",
        )
        .unwrap();
        assert_eq!(mount.point, PathBuf::from("/mnt/with space"));
        assert_eq!(mount.fstype, "cgroup");
        assert_eq!(mount.super_options, "rw,cpu,memory");
        assert_eq!(unescape("a\\134b\\"), "a\\b\\");
        assert!(Mount::parse("not a mount line").is_none());
    }
}
