//! Command line: `shufflefs mount`, `shufflefs unmount`, `shufflefs plan`, `shufflefs serve`
//! and `shufflefs status`.
//!
//! Clap only: the options, their ranges and their help. How options relate (what applies
//! to which mode, what contradicts what) is checked in `config`, which turns `MountArgs`
//! into the `MountConfig` the daemon runs on.

use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::cache::CacheLayout;
use crate::coded::DEFAULT_NU;
use crate::dataset::records::MAX_RECORD;
use crate::dataset::{Format, Framing, Grouping};
use crate::exchange::coded::routes::Multicast;
use crate::plan::ExchangeScope;

#[derive(Parser, Debug)]
#[command(
    name = "shufflefs",
    version,
    about = "Per-rank epoch views of an ImageFolder or packed-record dataset with partial-local shuffling"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of `MountArgs` costs nothing, and boxing it would change
// every caller that takes it.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Mount this rank's epoch view (run one per rank under mpirun/srun).
    Mount(MountArgs),
    /// Unmount a view and wait for its daemon to exit.
    Unmount(UnmountArgs),
    /// Print what a shuffle would cost (storage, samples and bytes moved, transmissions per
    /// scheme) without running anything.
    Plan(PlanArgs),
    /// Run the server rank of a coded shuffle (`mount --exchange coded`): world rank 0 of the
    /// same MPI job, it mounts nothing and multicasts coded packets of the source's samples.
    Serve(ServeArgs),
    /// Show the whole job as one table, read from any rank's mount: every rank's epoch,
    /// staging, exchange progress and rate, given-up peers, source fallbacks, problems and
    /// cache use (see docs/status.md, "The whole job").
    Status(StatusArgs),
}

/// `--exchange` of `shufflefs mount`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExchangeMode {
    /// Partial-local shuffling between the ranks (--fraction, --exchange-scope).
    Partial,
    /// A full reshuffle every epoch, sent by a `shufflefs serve` rank as XOR-coded multicast
    /// (--cache-fraction, --scheme).
    Coded,
}

/// `--scheme` of `shufflefs mount --exchange coded`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountScheme {
    /// The server unicasts what each rank lacks.
    Uncoded,
    /// XOR-coded multicast (the paper's Alg. 1-3).
    Coded,
    /// Coded plus carpool reallocation (Alg. 4, depth --nu).
    Ubershuffle,
}

/// `shufflefs serve`: what the server needs of its own; the rest comes from compute rank 0.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// The dataset, as the compute ranks' --source names it (the same files; the path may
    /// differ on the server's host). The server reads every sample it sends from here.
    #[arg(long)]
    pub source: PathBuf,
    /// Layout of the source.
    #[arg(long, value_enum, default_value_t = Format::Imagefolder)]
    pub format: Format,
    /// Refuse to serve compute ranks whose seed differs (default: take theirs).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Bytes of samples the server keeps in memory: the first samples it reads stay there
    /// until this is used up; any other sample is read from the source every time it is
    /// sent. Give at least the dataset's size to read each sample once for the whole run.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 30)]
    pub memory: u64,
}

/// `--equal-shares`: how views are made equal.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EqualSharesMode {
    /// Leave samples out of the longer views, least-left-out first.
    Drop,
}

/// `--scheme` of `shufflefs plan`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanScheme {
    /// The server unicasts what each rank lacks.
    Uncoded,
    /// XOR-coded multicast (the paper's Alg. 1-3).
    Coded,
    /// Coded plus carpool reallocation (Alg. 4, depth --nu).
    Ubershuffle,
    /// All three, side by side.
    All,
}

#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("storage").required(true).args(["fraction", "cache_fraction"])))]
pub struct PlanArgs {
    /// Samples in the dataset (q).
    #[arg(long)]
    pub samples: u64,
    /// Compute ranks (n); the server rank of the coded schemes is extra.
    #[arg(long)]
    pub ranks: u32,
    /// Partial-local exchange fraction Q (as `mount --fraction`): prints today's exchange and
    /// the coded schemes at the same storage per rank.
    #[arg(long, value_parser = parse_fraction)]
    pub fraction: Option<f64>,
    /// Fraction alpha of the dataset each rank caches (at least 1/ranks).
    #[arg(long, value_parser = parse_fraction)]
    pub cache_fraction: Option<f64>,
    /// Which scheme to count.
    #[arg(long, value_enum, default_value_t = PlanScheme::All)]
    pub scheme: PlanScheme,
    /// Seed of the random placements averaged over.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Bytes per sample (coded packets are one sample long).
    #[arg(long, default_value_t = 100_000)]
    pub sample_bytes: u64,
    /// Seeded epochs to average over.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub epochs: u32,
    /// UberShuffle's search depth nu (the paper uses 2).
    #[arg(long, default_value_t = DEFAULT_NU)]
    pub nu: usize,
}

/// Default exchange fraction: the paper's ImageNet-1K and CIFAR-100 runs reach global-shuffle
/// accuracy at Q = 0.3, with each rank storing only 1.3x its share.
pub(crate) const DEFAULT_FRACTION: f64 = 0.3;

/// `--read-path` (the type lives with the configuration, which the kernel binding reads).
pub use crate::sys::kernel::ReadPath;

#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// ImageFolder-style dataset: one sub-folder per class, samples inside; with --format
    /// tree, any folder of files; with --format records, one record file or a folder of
    /// shard files. Read by rank 0 for the index, and
    /// by every rank for the samples it holds. Or a bucket: s3://BUCKET/PREFIX, with the
    /// endpoint and credentials from the AWS_* variables (docs/s3.md).
    #[arg(long, help_heading = "Data")]
    pub source: PathBuf,
    /// Layout of the source: how its samples are found and read. `tree`: every file at any
    /// depth is a sample (a flat folder of .npz files, speaker/chapter/*.flac), and
    /// `epoch-N/` mirrors the source's folders, every one of them on every rank. `records`:
    /// one file or a folder of shard files of packed records (see --framing), shown as
    /// `epoch-N/part-*`. Never guessed: a source without class folders is refused with a
    /// pointer to `tree`, so a path that points one level off cannot mount as a tree.
    #[arg(long, value_enum, default_value_t = Format::Imagefolder, help_heading = "Data")]
    pub format: Format,

    /// Files every rank needs whole, not samples (repeatable; relative to --source): e.g.
    /// 'annotations/*.json', 'classes.txt'. Shown at their own path in every epoch on every
    /// rank, copied once per host into the cache, never exchanged.
    #[arg(
        long,
        value_name = "GLOB",
        help_heading = "Data",
        long_help = "Files every rank needs whole that are not samples (COCO's annotations/*.json, a classes.txt, normalisation statistics). Repeatable; each GLOB is a path relative to --source: `*`, `?` and `[...]` stay within one folder, `**` crosses folders (quote it from the shell).\n\n\
            A file a glob names is no sample: it is shown at its own path in every epoch on every rank (epoch-N/annotations/instances_train.json), copied from the source once per host into the first rank's cache (CACHE/side/), kept across epochs and remounts, never exchanged. Its bytes are in the status (`replicated`).\n\n\
            A glob that names no file is refused, naming it. With --format imagefolder a side file must lie at the top of the source or in a class folder (the folders the view shows); --format tree shows every folder. Not for --format records."
    )]
    pub replicate: Vec<String>,

    /// Every rank's view of an epoch holds exactly floor(N/M) samples, so DDP needs no
    /// join(): `drop` leaves out the rest, least-left-out first (see docs/layouts.md).
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        help_heading = "Data",
        long_help = "Make every rank's view of an epoch hold exactly floor(N/M) samples (N samples, M ranks), so data-parallel training runs the same number of steps on every rank and needs no DDP join() or uneven-input handling.\n\n\
            drop: a rank whose share is one longer leaves one sample out of its view (N mod M samples in all, per epoch). It leaves out the sample of its share left out the fewest times so far, ties by a seeded order, so left-out samples rotate; with --fraction 0 each longer share's samples are left out in turn. Samples are still staged and exchanged as without the option (the plan is unchanged); the view only hides them. The status shows `equal_shares`.\n\n\
            There is no `pad` (DistributedSampler's default, which repeats samples): a folder cannot list one file twice, so a repeat would need an invented name that no source has, which loaders that map names to labels or annotations would not find."
    )]
    pub equal_shares: Option<EqualSharesMode>,

    /// How records lie in the files (--format records) [default: lines].
    #[arg(
        long,
        value_enum,
        help_heading = "Records",
        long_help = "How records lie in the source files (--format records).\n\n\
            fixed: records of --record-size bytes back to back (binary rows); no pass over the \
            data is needed.\n\n\
            lines: one record per line ending in \\n (LIBSVM/svmlight, CSV, JSON lines); a last \
            line without \\n is a record too. See --header-line for CSV.\n\n\
            tfrecord: TFRecord files (length, CRC, data, CRC); both CRCs are checked.\n\n\
            tar: tar shards as webdataset writes them; consecutive members with the same key \
            (the name up to its first dot) form one record. [default: lines]"
    )]
    pub framing: Option<Framing>,

    /// Bytes per record for `--framing fixed` (1 to 2 GiB).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..=MAX_RECORD), help_heading = "Records")]
    pub record_size: Option<u64>,

    /// The unit of the shuffle: `pages` moves and orders records starting in the same 4 KiB
    /// page together (fewer page reads for small records, LIRS page-aware shuffling);
    /// `records` shuffles single records.
    #[arg(long, value_enum, default_value_t = Grouping::Pages, help_heading = "Records")]
    pub group: Grouping,

    /// `--framing lines`: each file's first line is a header (CSV column names); it is not
    /// a record, and every part starts with it so `pandas.read_csv` reads each part alone.
    #[arg(long, help_heading = "Records")]
    pub header_line: bool,

    /// Target size of the `part-NNNNN` files of an epoch view: a part ends with the first
    /// record that reaches it (records are never split). Suffixes K, M, G (powers of 1024).
    /// Default: 128M.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, help_heading = "Records")]
    pub part_size: Option<u64>,

    /// Local cache folder for this rank's share (local SSD). `{rank}` is replaced by the rank.
    /// A job started again with another number of ranks goes on from these folders at the
    /// epoch it reached, and removes those of ranks gone from a host (README, "Elastic
    /// restarts").
    #[arg(long, help_heading = "Data")]
    pub cache: String,

    /// How the cache stores samples: `files` (one file per sample) or `packed` (append-only
    /// segment files, for millions of small records) [default: files for imagefolder and tree].
    #[arg(
        long,
        value_enum,
        help_heading = "Data",
        long_help = "How the cache folder stores samples [default: files for --format imagefolder and tree].\n\n\
            files: one file per sample (CACHE/samples/<id>). Reads can pass through to the \
            file (--read-path passthrough) and ranks of one host hand samples over by hard \
            link. Best for samples of tens of KB and more.\n\n\
            packed: samples appended as records to a few large segment files \
            (CACHE/segments/*.seg) with an index in memory (16 bytes a sample), a checksum per \
            record, crash recovery at start-up and background compaction of records that \
            left. No file per sample, so millions of small records cost no inodes; reads go \
            through the daemon (no passthrough) and ranks of one host exchange through MPI.\n\n\
            A cache keeps the layout it was built with: mounting it with the other one is \
            refused; pass --reset-cache to rebuild it in the new layout."
    )]
    pub cache_layout: Option<CacheLayout>,

    /// Fraction Q of each rank's share sent to other ranks before every epoch (0 = local
    /// shuffling only, 1 = full global reshuffle). Each cache holds up to (1+Q) x its share.
    #[arg(long, default_value_t = DEFAULT_FRACTION, value_parser = parse_fraction, help_heading = "Shuffling")]
    pub fraction: f64,

    /// Which ranks exchange samples: `global` (any two ranks) or `node` (only ranks on the
    /// same host, so nothing crosses the network; costs shuffle quality).
    #[arg(
        long,
        value_enum,
        default_value_t = ExchangeScope::Global,
        help_heading = "Shuffling",
        long_help = "Which ranks exchange samples before each epoch.\n\n\
            global: any rank with any other (the paper's partial-local shuffling): the best \
            shuffle; samples moving between hosts cross the network.\n\n\
            node: only ranks on the same host, so nothing crosses the network. Shuffle \
            quality drops: each host's set of samples is fixed at epoch 0 for good (local \
            shuffling at host granularity, which loses accuracy on some datasets and at \
            scale); within a host it is partial-local with --fraction. For slow networks \
            with several ranks per host; with one rank per host nothing ever moves. A cache \
            made under node scope resumes only with the same ranks sharing a host (so never \
            with another number of ranks)."
    )]
    pub exchange_scope: ExchangeScope,

    /// How each epoch's share reaches a rank: `partial` (partial-local shuffling between the
    /// ranks, see --fraction) or `coded` (a full reshuffle every epoch, sent by a
    /// `shufflefs serve` rank started first in the same job; see README "Coded shuffling").
    #[arg(long, value_enum, default_value_t = ExchangeMode::Partial, help_heading = "Shuffling")]
    pub exchange: ExchangeMode,

    /// With --exchange coded: the fraction alpha of the whole dataset each rank caches (its
    /// share plus samples retained from earlier epochs); at least 1/ranks. More cache, more
    /// packets several ranks decode at once.
    #[arg(long, value_name = "ALPHA", value_parser = parse_fraction, required_if_eq("exchange", "coded"), help_heading = "Coded shuffling")]
    pub cache_fraction: Option<f64>,

    /// With --exchange coded: which packets the server sends.
    #[arg(long, value_enum, default_value_t = MountScheme::Ubershuffle, help_heading = "Coded shuffling")]
    pub scheme: MountScheme,

    /// With --exchange coded: at most this many MPI communicators carry the multicasts
    /// (created once at start-up; groups share them when all 2^ranks would not fit, see
    /// README "Coded shuffling"). 1 sends every packet to every rank.
    #[arg(long, value_name = "N", default_value_t = crate::coded::groups::DEFAULT_LIMIT, value_parser = clap::value_parser!(u32).range(1..=16384).map(|v| v as usize), help_heading = "Coded shuffling")]
    pub communicators: usize,

    /// With --exchange coded: how a packet for several ranks leaves the server: `ring` (the
    /// server scatters it, one chunk per receiver, and the receivers pass the chunks around:
    /// every byte leaves the server once) or `broadcast` (MPI's broadcast on the
    /// --communicators set, whose algorithm may send a packet from the server several times).
    #[arg(long, value_enum, default_value_t = Multicast::Ring, help_heading = "Coded shuffling")]
    pub multicast: Multicast,

    /// With --scheme ubershuffle: how many set sizes up the carpool search goes.
    #[arg(long, default_value_t = DEFAULT_NU, value_parser = parse_nu, help_heading = "Coded shuffling")]
    pub nu: usize,

    /// Seed for the partition and every exchange. Default: chosen by rank 0 (or reused from
    /// the cache on remount) and shown in `.shufflefs/status`.
    #[arg(long, help_heading = "Shuffling")]
    pub seed: Option<u64>,

    /// Stay in the foreground and exit when the folder is unmounted. Implied under
    /// mpirun/srun, which must keep their ranks alive.
    #[arg(long, help_heading = "Mount")]
    pub foreground: bool,

    /// Without an MPI launcher, meet the job's other ranks over TCP at HOST:PORT (rank 0's
    /// host; rank 0 listens there). RANK and WORLD_SIZE come from the environment. Default
    /// under torchrun or a Kubernetes job: MASTER_ADDR, port SHUFFLEFS_PORT or MASTER_PORT + 1.
    #[arg(long, value_name = "HOST:PORT", help_heading = "Mount")]
    pub rendezvous: Option<String>,

    /// Let other users see the view (needs `user_allow_other` in /etc/fuse.conf for non-root).
    #[arg(long, help_heading = "Mount")]
    pub allow_other: bool,

    /// Once every rank's mount answers, rank 0 writes a JSON record of the job here (job
    /// size, epoch, each rank's host and mount point); it removes the file when it stops.
    #[arg(
        long,
        value_name = "PATH",
        help_heading = "Mount",
        long_help = "Once every rank's mount answers, rank 0 writes a JSON record of the job to PATH: \
                     the job size, the current epoch and, for every rank, its rank, host name and \
                     absolute mount point (see docs/status.md, \"Ready file\"). The file is written \
                     atomically (a temporary file in the same folder, then a rename), replaces one \
                     left from before (rank 0 removes that as it starts), and is removed when rank 0 \
                     stops, so it never says ready for a job that is gone. Launchers wait for it \
                     instead of looking at every rank's mount, which other hosts cannot see. Only \
                     rank 0 writes it: no {rank} needed."
    )]
    pub ready_file: Option<PathBuf>,
    /// Writes this rank's metrics (Prometheus text) to PATH every few seconds, for
    /// node_exporter's textfile collector; `{rank}` and `{host}` are replaced.
    #[arg(
        long,
        value_name = "PATH",
        help_heading = "Mount",
        long_help = "Writes this rank's metrics in the Prometheus text format to PATH every 5 \
                     seconds (and once more as the daemon stops), atomically: a temporary file in \
                     the same folder, then a rename, so a collector never reads half a file. \
                     `{rank}` and `{host}` in PATH are replaced by the rank and the host name, so \
                     ranks sharing a folder write files of their own. PATH must end in .prom, as \
                     node_exporter's textfile collector (--collector.textfile.directory) reads only \
                     those. The same text is at MOUNT/.shufflefs/metrics; the names are in \
                     docs/status.md, \"Metrics\"."
    )]
    pub metrics_file: Option<String>,

    /// Throw away a cache built with other settings instead of refusing to mount.
    #[arg(long, help_heading = "Data")]
    pub reset_cache: bool,

    /// Bytes this rank's cache may hold (e.g. 30M, 2G, 1T) [default: what the cache folder's
    /// filesystem has free, plus what the cache holds already, minus 5% of the filesystem].
    #[arg(
        long,
        value_name = "BYTES",
        value_parser = parse_cache_size,
        help_heading = "Data",
        long_help = "Bytes this rank's cache may hold: a number with an optional unit, e.g. 30M, 2G or 1T (K, M, G, T, P are powers of 1024; a number under 4096 without a unit is refused, as a forgotten unit: no sample would fit), counted as the samples take the disk (whole blocks of its filesystem) [default: what the cache folder's filesystem has free, plus what the cache holds already, minus 5% of the filesystem's size; a larger size is cut to that, with a warning].\n\n\
            A rank caches its share plus what the next exchange brings in, at most (1 + Q) x its share. When that does not fit, the mount says so once, with the hit rate and the bytes read from the source per epoch to expect, and goes on with a partial cache: the samples that stay on the rank longest (the plan knows every future epoch) are kept, the rest are read from the source when opened (docs/partial-cache.md). --require-fit refuses instead. Under --exchange coded the cache holds its --cache-fraction of the dataset and the next share it receives; when that does not fit, each rank keeps a planned part of it, the server codes over the kept parts and the rest is read from the source (docs/coded.md)."
    )]
    pub cache_size: Option<u64>,

    /// Refuse to mount when (1 + Q) x this rank's share (under --exchange coded: its cache
    /// and the next share) does not fit the cache, instead of going on with a partial cache.
    #[arg(long, help_heading = "Data")]
    pub require_fit: bool,

    /// Scan the source again on a remount instead of reusing the cache's index: files
    /// removed or changed since are dropped from the cache, new files and classes appear,
    /// cached samples that are still the same (name, size, time) are kept.
    #[arg(long, help_heading = "Data")]
    pub rescan: bool,

    /// Cap on the bytes per second this rank sends during the background exchange, so
    /// training I/O keeps priority (e.g. 200000000 for 200 MB/s). Default: uncapped.
    #[arg(long, value_name = "BYTES_PER_S", help_heading = "Shuffling")]
    pub exchange_rate: Option<u64>,

    /// How samples move between ranks of one host: `auto` takes them from the other rank's
    /// cache folder (a hard link, or a copy across filesystems) when every rank of the host
    /// can see the others' caches; `never` sends them through MPI like any other move (for
    /// comparisons, or caches that must not share inodes). Any rank saying `never` makes its
    /// whole host use MPI.
    #[arg(long, value_enum, default_value_t = ShareDisk::Auto, help_heading = "Shuffling")]
    pub share_disk: ShareDisk,

    /// Stop waiting for a peer whose samples, at the rate it shows, take more than F times as
    /// long as they would at the rate of the slowest peer that already delivered (measured
    /// during the exchange, once half the peers have), plus a slack (--slow-peer-grace, at
    /// most the longest delivery): what it has not delivered is fetched from the source, so
    /// one slow node does not hold every rank's next epoch; a node every peer gave up leaves
    /// the later exchanges and fetches its shares from the source. 0 waits for every peer.
    #[arg(long, value_name = "F", default_value_t = 4.0, value_parser = non_negative, help_heading = "Shuffling")]
    pub slow_peer_factor: f64,

    /// Seconds added to every slow-peer deadline, at most the longest delivery for a peer that
    /// shows its rate (see --slow-peer-factor).
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, value_parser = non_negative, help_heading = "Shuffling")]
    pub slow_peer_grace: f64,

    /// Threads copying samples from the source into the cache [default: 4; for an s3://
    /// source 32, the requests in flight per rank (docs/s3.md)].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256), help_heading = "Tuning")]
    pub staging_threads: Option<u16>,

    /// Threads answering kernel requests [default: with passthrough: one per CPU core, 2 to
    /// 8; otherwise 8]. Passthrough sends every open and close here, and each idle thread
    /// makes a request cost a wake-up; requests that wait (a sample not cached yet, an epoch
    /// advance) run on other threads. Without passthrough (page-cache or daemon mode, or no
    /// CAP_SYS_ADMIN) reads come here and wait on the disk, so threads are reads in flight.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256), help_heading = "Tuning")]
    pub fuse_threads: Option<u16>,

    /// How reads of samples reach the cache files (see README, "Read path").
    #[arg(long, value_enum, default_value_t = ReadPath::Auto, help_heading = "Tuning")]
    pub read_path: ReadPath,

    /// Where the view appears. `{rank}` is replaced by the rank. Must be an empty folder, or
    /// missing: then the daemon creates it (and missing parents) once every rank is ready to
    /// mount, and removes the folders it created when it stops.
    pub mountpoint: String,
}

#[derive(Args, Debug)]
pub struct UnmountArgs {
    /// A mounted shufflefs view.
    pub mountpoint: PathBuf,
    /// Seconds to wait for the daemon to exit after unmounting.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Unmount even while files are open: the view disappears at once, open files keep
    /// reading, and the daemon exits when the last of them is closed (a daemon still
    /// running after --timeout is then not a failure).
    #[arg(long)]
    pub lazy: bool,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// A mounted shufflefs view, of any rank of the job.
    pub mountpoint: PathBuf,
    /// Print the status's `job` object (JSON) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Refresh every second until interrupted (Ctrl-C); on a terminal in place, otherwise
    /// one table after another.
    #[arg(long)]
    pub watch: bool,
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    let q: f64 = s.parse().map_err(|_| {
        format!("{s:?} is not a number; --fraction takes a value in [0, 1], e.g. 0.3")
    })?;
    if (0.0..=1.0).contains(&q) {
        Ok(q)
    } else {
        Err(format!(
            "{q} is outside [0, 1]; --fraction is the share of samples exchanged per epoch, e.g. 0.3"
        ))
    }
}

fn parse_nu(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(nu) if (1..crate::coded::MAX_NODES).contains(&nu) => Ok(nu),
        _ => Err(format!(
            "{s:?}: --nu is how many set sizes up UberShuffle searches, 1 to {} (the paper uses 2)",
            crate::coded::MAX_NODES - 1
        )),
    }
}

/// A byte count with an optional K/M/G/T/P suffix (powers of 1024), at least 1.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        "P" => 50,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?}; write bytes, e.g. 65536, 64K, 128M, 1G or 2T"
            ));
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size; write e.g. 65536, 64K, 128M or 1G"))?;
    match n.checked_mul(1 << shift) {
        Some(v) if v > 0 => Ok(v),
        _ => Err(format!("{s:?} is out of range; a size is at least 1 byte")),
    }
}

/// Below this many bytes a cache holds no sample (less than a filesystem block).
const SMALLEST_BARE_CACHE: u64 = 4096;

/// `--cache-size`: [`parse_bytes`], refusing a bare number under [`SMALLEST_BARE_CACHE`]:
/// `--cache-size 1` is a forgotten unit far more often than a cache of one byte, which
/// would mount with "0.0 MB of cache" and read every sample from the source.
fn parse_cache_size(s: &str) -> Result<u64, String> {
    let n = parse_bytes(s)?;
    let bare = s.trim().bytes().all(|b| b.is_ascii_digit());
    if bare && n < SMALLEST_BARE_CACHE {
        return Err(format!(
            "{s:?} is {n} bytes (a number without a unit counts bytes), too small to hold \
             a sample: give the unit, e.g. {s}G or {s}M"
        ));
    }
    Ok(n)
}

/// See `--share-disk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ShareDisk {
    Auto,
    Never,
}

/// A finite number of at least 0 (and at most a million), for factors and seconds.
fn non_negative(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && (0.0..=1e6).contains(&x) => Ok(x),
        Ok(_) => Err(format!("{v} is not between 0 and 1000000")),
        Err(e) => Err(format!("{v} is not a number: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{non_negative, parse_bytes, parse_cache_size};

    #[test]
    fn sizes_take_suffixes_and_reject_nonsense() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert_eq!(parse_bytes("128MiB"), Ok(128 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert_eq!(parse_bytes("2T"), Ok(2 << 40));
        assert_eq!(parse_bytes("3PiB"), Ok(3 << 50));
        assert!(parse_bytes("20000P").is_err(), "past u64");
        // The documented default of --part-size is the view's.
        assert_eq!(parse_bytes("128M"), Ok(crate::vfs::DEFAULT_PART_SIZE));
        for bad in ["", "0", "12X", "-5", "99999999999G"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    /// `--cache-size 1` (a forgotten unit) is refused, naming the unit; a bare number of
    /// bytes a block can hold, and a small size with a unit, are taken (was: 1 byte taken).
    #[test]
    fn a_cache_size_without_a_unit_that_holds_nothing_is_refused() {
        let err = parse_cache_size("1").unwrap_err();
        assert!(
            err.contains("without a unit") && err.contains("1G"),
            "{err}"
        );
        assert!(parse_cache_size("4095").is_err());
        assert_eq!(parse_cache_size("4096"), Ok(4096));
        assert_eq!(parse_cache_size("204800"), Ok(200 << 10));
        assert_eq!(parse_cache_size("1K"), Ok(1024));
        assert!(parse_cache_size("0").is_err() && parse_cache_size("2X").is_err());
    }

    #[test]
    fn factors_and_seconds_must_be_finite_and_non_negative() {
        assert_eq!(non_negative("2.5"), Ok(2.5));
        assert_eq!(non_negative("0"), Ok(0.0));
        for bad in ["nan", "inf", "-1", "1e9", "x"] {
            assert!(non_negative(bad).is_err(), "{bad}");
        }
    }
}
