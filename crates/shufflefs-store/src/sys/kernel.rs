//! What the running kernel offers this process, read from `/proc`.
//!
//! Probed before mounting, because the request thread count depends on whether reads will
//! pass through (see `config::MountConfig::fuse_threads`); the FUSE handshake still has the last
//! word, since a kernel built without passthrough only says so there.

/// How the kernel reads a sample's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ReadPath {
    /// Chosen at mount from this rank's share and the machine: `page-cache` for a share of
    /// small files that fits in memory, `passthrough` otherwise (docs/read-paths.md).
    Auto,
    /// Each open asks the daemon, which hands the kernel the cache file (FUSE passthrough,
    /// Linux 6.9+): reads never enter the daemon and no page is cached twice. Falls back to
    /// `daemon` where the kernel lacks passthrough.
    Passthrough,
    /// Opens never reach the daemon; the first read of a page does, and from then on the
    /// kernel's page cache serves it at native speed, across opens and across epochs for the
    /// samples this rank keeps. Best for many small files read more than once.
    PageCache,
    /// Each open asks the daemon, and reads are served by the daemon from the cache file,
    /// kept in the page cache across opens.
    Daemon,
}

impl ReadPath {
    /// The name `--read-path` takes.
    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Auto => "auto",
            ReadPath::Passthrough => "passthrough",
            ReadPath::PageCache => "page-cache",
            ReadPath::Daemon => "daemon",
        }
    }
}

/// Whether reads can pass through with `read_path`: the kernel has FUSE passthrough from
/// Linux 6.9, and registers backing files only for a daemon with CAP_SYS_ADMIN (6.9 to at
/// least 6.18).
pub fn may_pass_through(read_path: ReadPath) -> bool {
    read_path == ReadPath::Passthrough && has_cap_sys_admin() && kernel_at_least(&release(), (6, 9))
}

fn has_cap_sys_admin() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
        })
        .unwrap_or(0);
    effective & (1 << CAP_SYS_ADMIN) != 0
}

/// The kernel's release string, such as `6.18.0-1-amd64`; empty if unreadable.
fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default()
}

/// Whether a kernel release string such as `6.18.0-1-amd64` is `min` or later.
fn kernel_at_least(release: &str, min: (u32, u32)) -> bool {
    let mut parts = release.trim().split(['.', '-']);
    let mut number = || parts.next().and_then(|p| p.parse::<u32>().ok());
    match (number(), number()) {
        (Some(major), Some(minor)) => (major, minor) >= min,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::kernel_at_least;

    #[test]
    fn kernel_release_comparison() {
        assert!(kernel_at_least("6.18.0-1-amd64\n", (6, 9)));
        assert!(kernel_at_least("6.9", (6, 9)));
        assert!(kernel_at_least("7.0.1", (6, 9)));
        assert!(!kernel_at_least("6.8.12-generic", (6, 9)));
        assert!(!kernel_at_least("5.15.0", (6, 9)));
        assert!(!kernel_at_least("", (6, 9)));
        assert!(!kernel_at_least("garbage", (6, 9)));
    }
}
