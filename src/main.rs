use std::process::ExitCode;

use clap::Parser;
use shufflefs::cli::{Cli, Command};

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Mount(args) => shufflefs::launch::mount(args),
        Command::Unmount(args) => shufflefs::launch::unmount(&args),
    }
}
