//! The validated configuration of a mount (and of a coded server), between the command line
//! and the daemon.
//!
//! `cli` is clap only: it parses, with ranges and help text. Everything that relates two
//! options lives here, once: `MountConfig::try_from` refuses contradictory settings with
//! the message the user sees, and the result holds only settings that make sense together.
//! Options of one exchange mode sit inside that mode's variant of [`ExchangeMode`], and the
//! record options inside `SourceConfig::Records`, so code below the daemon never asks
//! "is this set, and does it apply?". Nothing below `daemon/` imports `cli`.

use std::path::PathBuf;
use std::time::Duration;

use crate::cache::CacheLayout;
use crate::cli::{self, MountArgs, MountScheme, PlanArgs, PlanScheme, ServeArgs};
use crate::coded::Scheme;
use crate::coded::calc::{CalcInput, Storage};
use crate::dataset::{Format, Framing, RecordParams};
use crate::exchange::SlowPeers;
use crate::exchange::coded::routes::Multicast;
use crate::plan::ExchangeScope;

pub use crate::sys::kernel::ReadPath;

/// What the source is and how its samples are found.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SourceConfig {
    /// One sub-folder per class, one file per sample.
    ImageFolder,
    /// Every file at any depth a sample (`--format tree`).
    Tree,
    /// Packed records, shown as `epoch-N/part-*` files of about `part_size` bytes.
    Records {
        params: RecordParams,
        part_size: u64,
    },
}

impl SourceConfig {
    pub(crate) fn format(&self) -> Format {
        match self {
            SourceConfig::ImageFolder => Format::Imagefolder,
            SourceConfig::Tree => Format::Tree,
            SourceConfig::Records { .. } => Format::Records,
        }
    }

    /// The record settings (an image folder has none: the defaults, which nothing reads).
    pub(crate) fn params(&self) -> RecordParams {
        match self {
            SourceConfig::ImageFolder | SourceConfig::Tree => RecordParams::default(),
            SourceConfig::Records { params, .. } => params.clone(),
        }
    }

    /// Target size of a record view's parts (an image folder has no parts: the default).
    pub(crate) fn part_size(&self) -> u64 {
        match self {
            SourceConfig::ImageFolder | SourceConfig::Tree => crate::vfs::DEFAULT_PART_SIZE,
            SourceConfig::Records { part_size, .. } => *part_size,
        }
    }
}

/// How each epoch's share reaches a rank, with the options of that way only.
#[derive(Clone, Debug, PartialEq)]
pub enum ExchangeMode {
    /// Partial-local shuffling between the ranks (the fraction is `MountConfig::fraction`).
    Partial {
        scope: ExchangeScope,
        /// Ranks of one host may take samples from each other's cache folders.
        share_disk: bool,
        slow_peers: SlowPeers,
    },
    /// A full reshuffle every epoch, multicast by a `shufflefs serve` rank.
    Coded {
        /// Fraction of the whole dataset each rank caches.
        alpha: f64,
        scheme: Scheme,
        /// `--nu` as given (also inside `scheme` for UberShuffle), told to the server.
        nu: usize,
        multicast: Multicast,
        communicators: usize,
    },
}

/// One rank's validated mount settings.
#[derive(Clone, Debug)]
pub(crate) struct MountConfig {
    pub source: PathBuf,
    pub source_config: SourceConfig,
    /// `--replicate`: globs of the side files (checked; see `dataset::side`).
    pub replicate: Vec<String>,
    /// `--equal-shares drop`: every view holds floor(N/M) samples (see `plan::equal`).
    pub equal_shares: bool,
    /// Cache folder template (`{rank}` is replaced, see [`for_rank`]).
    pub cache: String,
    pub layout: CacheLayout,
    /// Mount point template (`{rank}` is replaced).
    pub mountpoint: String,
    /// `--fraction`: the partial exchange's Q. A coded run records it in the cache state too
    /// (as it always did), so it stays here rather than inside [`ExchangeMode::Partial`].
    pub fraction: f64,
    pub exchange: ExchangeMode,
    pub seed: Option<u64>,
    pub foreground: bool,
    /// `--rendezvous`: where a job without an MPI launcher meets over TCP (see
    /// `comm::Contract`).
    pub rendezvous: Option<String>,
    pub allow_other: bool,
    /// `--ready-file`: rank 0 writes the job's ready record here (`daemon::ready`).
    pub ready_file: Option<PathBuf>,
    /// `--metrics-file`: where each rank writes its metrics (`{rank}`, `{host}` replaced;
    /// see `daemon::metrics_file`).
    pub metrics_file: Option<String>,
    pub reset_cache: bool,
    /// `--cache-size` (None: from the cache's filesystem, see `daemon::startup::fit`).
    pub cache_size: Option<u64>,
    /// `--require-fit`: refuse a partial cache.
    pub require_fit: bool,
    /// `--rescan`: the source is scanned (by every rank, each its part, for a folder source)
    /// even when its cache holds an index, and a cache built on another index keeps what is
    /// still valid (see `daemon::startup::rescan`).
    pub rescan: bool,
    /// Bytes per second the background exchange may send (None: uncapped).
    pub exchange_rate: Option<u64>,
    pub staging_threads: usize,
    fuse_threads: Option<u16>,
    pub read_path: ReadPath,
}

impl TryFrom<MountArgs> for MountConfig {
    type Error = String;

    /// Every refusal of the command line's combinations, with the message the user reads.
    fn try_from(args: MountArgs) -> Result<MountConfig, String> {
        let source_config = source_config(&args)?;
        crate::dataset::side::Globs::parse(&args.replicate)?;
        if !args.replicate.is_empty() && args.format == Format::Records {
            return Err("--replicate applies to --format imagefolder and tree (a record source's files are all records); drop --replicate, or keep the side files outside the record folder".into());
        }
        crate::dataset::s3::check_args(&args.source, args.format, !args.replicate.is_empty())?;
        if args.exchange_rate == Some(0) {
            return Err("--exchange-rate 0 would never send a sample, so the exchange could not finish; give a cap in bytes per second (e.g. 200000000 for 200 MB/s) or leave it out for no cap".into());
        }
        if (args.metrics_file.as_ref()).is_some_and(|p| !p.ends_with(".prom")) {
            return Err("--metrics-file must end in .prom: node_exporter's textfile collector reads only those files".into());
        }
        let exchange = exchange_mode(&args)?;
        let layout = args
            .cache_layout
            .unwrap_or_else(|| CacheLayout::default_for(args.format));
        let staging_threads = args.staging_threads.map_or_else(
            || crate::dataset::s3::default_staging_threads(&args.source),
            usize::from,
        );
        Ok(MountConfig {
            source: args.source,
            source_config,
            replicate: args.replicate,
            equal_shares: args.equal_shares.is_some(),
            cache: args.cache,
            layout,
            mountpoint: args.mountpoint,
            fraction: args.fraction,
            exchange,
            seed: args.seed,
            foreground: args.foreground,
            rendezvous: args.rendezvous,
            allow_other: args.allow_other,
            ready_file: args.ready_file,
            metrics_file: args.metrics_file,
            reset_cache: args.reset_cache,
            cache_size: args.cache_size,
            require_fit: args.require_fit,
            rescan: args.rescan,
            exchange_rate: args.exchange_rate,
            staging_threads,
            fuse_threads: args.fuse_threads,
            read_path: args.read_path,
        })
    }
}

/// The record settings, checked against `--format` and each other.
fn source_config(args: &MountArgs) -> Result<SourceConfig, String> {
    if args.format != Format::Records {
        let given = [
            (args.framing.is_some(), "--framing"),
            (args.record_size.is_some(), "--record-size"),
            (args.header_line, "--header-line"),
            (args.part_size.is_some(), "--part-size"),
        ];
        if let Some((_, flag)) = given.iter().find(|g| g.0) {
            return Err(format!(
                "{flag} applies to record sources; add --format records or drop {flag}"
            ));
        }
        return Ok(match args.format {
            Format::Tree => SourceConfig::Tree,
            _ => SourceConfig::ImageFolder,
        });
    }
    let framing = args.framing.unwrap_or_default();
    let record_size = match (framing, args.record_size) {
        (Framing::Fixed, Some(size)) => size,
        (Framing::Fixed, None) => {
            return Err(
                "--framing fixed needs --record-size BYTES (the size of one record)".into(),
            );
        }
        (_, Some(_)) => {
            return Err(format!(
                "--record-size applies to --framing fixed only; {} records carry their own lengths",
                framing.name()
            ));
        }
        (_, None) => 0,
    };
    if args.header_line && framing != Framing::Lines {
        return Err("--header-line applies to --framing lines only".into());
    }
    let params = RecordParams {
        framing,
        record_size,
        grouping: args.group,
        header_line: args.header_line,
    };
    Ok(SourceConfig::Records {
        params,
        part_size: args.part_size.unwrap_or(crate::vfs::DEFAULT_PART_SIZE),
    })
}

/// `--exchange` and the options that belong to it (or contradict it).
fn exchange_mode(args: &MountArgs) -> Result<ExchangeMode, String> {
    match args.exchange {
        cli::ExchangeMode::Partial => {
            if args.cache_fraction.is_some() {
                return Err("--cache-fraction applies to --exchange coded only (partial-local shuffling caches (1+--fraction) x the share)".into());
            }
            Ok(ExchangeMode::Partial {
                scope: args.exchange_scope,
                share_disk: args.share_disk == cli::ShareDisk::Auto,
                slow_peers: SlowPeers {
                    // Both checked finite and in [0, 1e6] by the command line.
                    factor: args.slow_peer_factor,
                    grace: Duration::from_secs_f64(args.slow_peer_grace),
                    ..SlowPeers::default()
                },
            })
        }
        cli::ExchangeMode::Coded => {
            if args.exchange_scope == ExchangeScope::Node {
                return Err("--exchange-scope node keeps samples on their host, --exchange coded reshuffles the whole dataset every epoch: choose one".into());
            }
            let alpha = args
                .cache_fraction
                .ok_or("--exchange coded needs --cache-fraction ALPHA")?;
            let scheme = match args.scheme {
                MountScheme::Uncoded => Scheme::Uncoded,
                MountScheme::Coded => Scheme::Coded,
                MountScheme::Ubershuffle => Scheme::Ubershuffle { nu: args.nu },
            };
            Ok(ExchangeMode::Coded {
                alpha,
                scheme,
                nu: args.nu,
                multicast: args.multicast,
                communicators: args.communicators,
            })
        }
    }
}

impl MountConfig {
    pub(crate) fn format(&self) -> Format {
        self.source_config.format()
    }

    /// Whether the view shows each folder's and sample's own owner and mode: under
    /// `--allow-other`, for a folder source (a bucket has none; a record source shows its
    /// root's, see `vfs::access`).
    pub(crate) fn owners_per_entry(&self) -> bool {
        self.allow_other
            && self.format() != Format::Records
            && !crate::dataset::s3::is_s3(&self.source)
    }

    /// Whether the source is scanned at this mount whatever rank 0's cache holds: `--rescan`,
    /// or owners and modes per entry, which must be today's (a `chmod` since the last
    /// mount must show; see `dataset::owners`).
    pub(crate) fn rescans(&self) -> bool {
        self.rescan || self.owners_per_entry()
    }

    /// Which ranks exchange samples (a coded run reshuffles globally).
    pub(crate) fn scope(&self) -> ExchangeScope {
        match &self.exchange {
            ExchangeMode::Partial { scope, .. } => *scope,
            ExchangeMode::Coded { .. } => ExchangeScope::Global,
        }
    }

    /// The coded scheme, under `--exchange coded`.
    pub(crate) fn coded_scheme(&self) -> Option<Scheme> {
        match &self.exchange {
            ExchangeMode::Coded { scheme, .. } => Some(*scheme),
            ExchangeMode::Partial { .. } => None,
        }
    }

    /// The cache fraction alpha, under `--exchange coded`.
    pub(crate) fn coded_alpha(&self) -> Option<f64> {
        match &self.exchange {
            ExchangeMode::Coded { alpha, .. } => Some(*alpha),
            ExchangeMode::Partial { .. } => None,
        }
    }

    /// `--fuse-threads`, or its default for this machine and whether reads will pass
    /// through (see `sys::kernel::may_pass_through`).
    pub(crate) fn fuse_threads(&self, passes_through: bool) -> usize {
        let default = || {
            if passes_through {
                std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
            } else {
                8
            }
        };
        self.fuse_threads.map_or_else(default, usize::from)
    }
}

/// `shufflefs serve`'s settings (nothing to relate: a plain copy, so the server's code does
/// not import the command line either).
#[derive(Clone, Debug)]
pub(crate) struct ServeConfig {
    pub source: PathBuf,
    pub format: Format,
    pub seed: Option<u64>,
    pub memory: u64,
}

impl From<ServeArgs> for ServeConfig {
    fn from(args: ServeArgs) -> ServeConfig {
        ServeConfig {
            source: args.source,
            format: args.format,
            seed: args.seed,
            memory: args.memory,
        }
    }
}

/// `shufflefs plan`'s settings as the calculator takes them (see `coded::calc::report`).
pub fn plan_input(args: &PlanArgs) -> CalcInput {
    let storage = match (args.fraction, args.cache_fraction) {
        (Some(q), _) => Storage::Fraction(q),
        (None, Some(a)) => Storage::CacheFraction(a),
        (None, None) => unreachable!("clap requires --fraction or --cache-fraction"),
    };
    let uber = Scheme::Ubershuffle { nu: args.nu };
    let schemes = match args.scheme {
        PlanScheme::Uncoded => vec![Scheme::Uncoded],
        PlanScheme::Coded => vec![Scheme::Coded],
        PlanScheme::Ubershuffle => vec![uber],
        PlanScheme::All => vec![Scheme::Uncoded, Scheme::Coded, uber],
    };
    CalcInput {
        samples: args.samples,
        ranks: args.ranks as usize,
        storage,
        schemes,
        seed: args.seed,
        sample_bytes: args.sample_bytes,
        epochs: args.epochs,
    }
}

/// Refuses a source, cache folder and mount point of rank `rank` that overlap: one equal to
/// or inside another, by any path (symlinks are followed: the paths are compared
/// canonically; a path that does not exist yet is its nearest existing ancestor's canonical
/// path plus the rest). A cache in the source would be served as samples, a source in the
/// cache could be emptied by `--reset-cache`, a mount point in the source shows up as a
/// class, a cache in the mount point is hidden by the mount. It reads the file system and
/// creates nothing, so it runs before anything is created: first among the local checks,
/// and in `launch` before a detached daemon opens its log in the cache folder.
pub(crate) fn check_overlaps(config: &MountConfig, rank: u32) -> Result<(), String> {
    let given = [
        ("--source", config.source.clone()),
        ("--cache", for_rank(&config.cache, rank)),
        ("the mount point", for_rank(&config.mountpoint, rank)),
    ];
    let resolved: Vec<PathBuf> = given.iter().map(|(_, p)| resolve(p)).collect();
    let show = |i: usize| {
        let (name, path) = &given[i];
        match resolved[i] == *path {
            true => format!("{name} {}", path.display()),
            false => format!("{name} {} (= {})", path.display(), resolved[i].display()),
        }
    };
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        // A bucket overlaps no folder.
        if a == 0 && crate::dataset::s3::is_s3(&config.source) {
            continue;
        }
        // Named the later first ("--cache X is inside --source Y") unless it holds the other.
        let (inner, relation, outer) = if resolved[a] == resolved[b] {
            (b, "is the same folder as", a)
        } else if resolved[b].starts_with(&resolved[a]) {
            (b, "is inside", a)
        } else if resolved[a].starts_with(&resolved[b]) {
            (a, "is inside", b)
        } else {
            continue;
        };
        return Err(overlap(&show(inner), relation, &show(outer)));
    }
    Ok(())
}

fn overlap(inner: &str, relation: &str, outer: &str) -> String {
    format!(
        "{inner} {relation} {outer}; the source, the cache folder and the mount point must be three separate places, none inside another (shufflefs would serve its own files as data, or hide or remove them): pick a --cache and a mount point outside the dataset and outside each other, e.g. --cache /local/sfs-cache-{{rank}}"
    )
}

/// `path` made absolute and canonical as far as it exists: its nearest existing ancestor's
/// canonical path, then the rest as written.
fn resolve(path: &std::path::Path) -> PathBuf {
    let absolute = match path.is_absolute() {
        true => path.to_path_buf(),
        false => std::env::current_dir().unwrap_or_default().join(path),
    };
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    let mut base = loop {
        if let Ok(canonical) = existing.canonicalize() {
            break canonical;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                existing = parent;
            }
            // A missing path ending in `..`: compared as written.
            _ => return absolute,
        }
    };
    base.extend(rest.iter().rev());
    base
}

/// Replaces `{rank}` in a path template.
pub(crate) fn for_rank(template: &str, rank: u32) -> PathBuf {
    PathBuf::from(template.replace("{rank}", &rank.to_string()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::MountConfig;
    use crate::cli::{Cli, Command};

    fn mount(extra: &[&str]) -> Result<MountConfig, String> {
        let mut argv = vec!["shufflefs", "mount", "--source", "/s", "--cache", "/c"];
        argv.extend_from_slice(extra);
        argv.push("/m");
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Mount(args) => MountConfig::try_from(args),
            _ => panic!("not mount"),
        }
    }

    #[test]
    fn a_metrics_file_must_end_in_prom() {
        let refused = mount(&["--metrics-file", "/m/sfs-{rank}.txt"]).unwrap_err();
        assert!(refused.contains(".prom"), "{refused}");
        let ok = mount(&["--metrics-file", "/m/sfs-{host}-{rank}.prom"]).unwrap();
        assert_eq!(
            ok.metrics_file.as_deref(),
            Some("/m/sfs-{host}-{rank}.prom")
        );
    }

    #[test]
    fn record_flags_are_checked_together() {
        let fixed = mount(&[
            "--format",
            "records",
            "--framing",
            "fixed",
            "--record-size",
            "8",
        ]);
        assert_eq!(fixed.unwrap().source_config.params().record_size, 8);
        for (extra, needle) in [
            (
                &["--format", "records", "--framing", "fixed"][..],
                "needs --record-size",
            ),
            (
                &["--format", "records", "--record-size", "8"][..],
                "fixed only",
            ),
            (&["--framing", "tar"][..], "--format records"),
            (
                &["--part-size", "1M"][..],
                "--part-size applies to record sources",
            ),
            (
                &["--format", "records", "--framing", "tar", "--header-line"][..],
                "lines only",
            ),
        ] {
            let err = mount(extra).unwrap_err();
            assert!(err.contains(needle), "{extra:?}: {err}");
        }
    }

    #[test]
    fn cache_size_takes_units_also_coded() {
        let c = mount(&["--cache-size", "30M", "--require-fit"]).unwrap();
        assert_eq!(c.cache_size, Some(30 << 20));
        assert!(c.require_fit);
        assert_eq!(mount(&[]).unwrap().cache_size, None);
        // A coded cache that does not fit keeps planned parts (`plan::coded_keep`).
        let coded = ["--exchange", "coded", "--cache-fraction", "0.5"];
        let c = mount(&[&coded[..], &["--cache-size", "2G", "--require-fit"]].concat()).unwrap();
        assert_eq!((c.cache_size, c.require_fit), (Some(2 << 30), true));
    }

    /// Source, cache and mount point overlapping in any direction, equal, or through a
    /// symlink, are refused naming both; paths that do not exist yet are compared too.
    #[test]
    fn overlapping_folders_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let p = |name: &str| tmp.path().join(name).display().to_string();
        std::fs::create_dir_all(tmp.path().join("ds/a")).unwrap();
        std::fs::create_dir_all(tmp.path().join("m0")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("ds"), tmp.path().join("link")).unwrap();
        let check = |source: &str, cache: &str, mnt: &str| {
            let argv = [
                "shufflefs",
                "mount",
                "--source",
                source,
                "--cache",
                cache,
                mnt,
            ];
            let Command::Mount(args) = Cli::try_parse_from(argv).unwrap().command else {
                panic!("not mount");
            };
            super::check_overlaps(&MountConfig::try_from(args).unwrap(), 0)
        };
        let (ds, m0) = (p("ds"), p("m0"));
        for (cache, mnt, needles) in [
            (
                p("ds/cachein"),
                m0.clone(),
                ["--cache", "is inside --source"],
            ),
            (
                ds.clone(),
                m0.clone(),
                ["--cache", "is the same folder as --source"],
            ),
            (p("c"), p("ds/a"), ["the mount point", "is inside --source"]),
            (
                p("m0/x"),
                m0.clone(),
                ["--cache", "is inside the mount point"],
            ),
            (
                m0.clone(),
                m0.clone(),
                ["the mount point", "is the same folder as --cache"],
            ),
            (
                p("link/new/deeper"),
                m0.clone(),
                ["(= ", "is inside --source"],
            ),
            (p(""), m0.clone(), ["--source", "is inside --cache"]),
            (
                p("m0/../ds/x"),
                m0.clone(),
                ["--cache", "is inside --source"],
            ),
        ] {
            let err = check(&ds, &cache, &mnt).expect_err(&cache);
            for n in needles {
                assert!(err.contains(n), "{cache} {mnt}: {err}");
            }
            assert!(err.contains(&cache) || err.contains(&mnt), "{err}");
        }
        assert_eq!(check(&ds, &p("c-{rank}"), &m0), Ok(()));
        assert_eq!(
            check(&ds, &p("dsx"), &p("m0x")),
            Ok(()),
            "a shared prefix is no overlap"
        );
        assert!(!tmp.path().join("ds/cachein").exists() && !tmp.path().join("c").exists());
    }

    #[test]
    fn an_exchange_rate_of_zero_is_refused() {
        let err = mount(&["--exchange-rate", "0"]).unwrap_err();
        assert!(
            err.contains("--exchange-rate 0") && err.contains("leave it out"),
            "{err}"
        );
        let capped = mount(&["--exchange-rate", "1000"]).unwrap();
        assert_eq!(capped.exchange_rate, Some(1000));
    }

    #[test]
    fn coded_options_need_the_coded_exchange() {
        let err = mount(&["--cache-fraction", "0.5"]).unwrap_err();
        assert!(err.contains("--cache-fraction applies to --exchange coded only"));
        let err = mount(&[
            "--exchange",
            "coded",
            "--cache-fraction",
            "0.5",
            "--exchange-scope",
            "node",
        ])
        .unwrap_err();
        assert!(err.contains("choose one"), "{err}");
        let coded = mount(&["--exchange", "coded", "--cache-fraction", "0.5"]).unwrap();
        assert_eq!(coded.coded_alpha(), Some(0.5));
        assert_eq!(coded.scope(), crate::plan::ExchangeScope::Global);
    }

    #[test]
    fn the_cache_layout_defaults_by_format_and_can_be_chosen() {
        use crate::cache::CacheLayout;
        let layout = |extra: &[&str]| mount(extra).map(|m| m.layout);
        assert_eq!(layout(&[]), Ok(CacheLayout::Files));
        assert_eq!(
            layout(&["--cache-layout", "packed"]),
            Ok(CacheLayout::Packed)
        );
        assert_eq!(layout(&["--cache-layout", "files"]), Ok(CacheLayout::Files));
        let bad = ["shufflefs", "mount", "--source", "/s", "--cache", "/c"];
        let err = Cli::try_parse_from(bad.iter().chain(&["--cache-layout", "pack", "/m"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("files") && err.contains("packed"), "{err}");
    }

    #[test]
    fn plan_subcommand_formats_a_small_case() {
        let cli = Cli::try_parse_from([
            "shufflefs",
            "plan",
            "--samples",
            "60",
            "--ranks",
            "3",
            "--cache-fraction",
            "0.5",
            "--scheme",
            "all",
            "--sample-bytes",
            "1000",
        ])
        .unwrap();
        let Command::Plan(args) = cli.command else {
            panic!("not the plan subcommand");
        };
        let input = super::plan_input(&args);
        let text = crate::coded::calc::report(&input).unwrap();
        assert!(
            text.contains("cache s = floor(alpha q) = 30 samples each (30.0 kB)"),
            "{text}"
        );
        assert_eq!(
            text.lines().filter(|l| l.starts_with("uncoded ")).count(),
            1,
            "{text}"
        );
        assert!(text.contains("ubershuffle(nu=2)"), "{text}");
        let both = Cli::try_parse_from([
            "shufflefs",
            "plan",
            "--samples",
            "60",
            "--ranks",
            "3",
            "--fraction",
            "0.3",
            "--cache-fraction",
            "0.5",
        ]);
        assert!(
            both.is_err(),
            "--fraction and --cache-fraction exclude each other"
        );
    }
}
