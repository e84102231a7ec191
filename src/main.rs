use std::process::ExitCode;

use clap::Parser;
use shufflefs::cli::{Cli, Command};

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Mount(args) => shufflefs::launch::mount(args),
        Command::Unmount(args) => shufflefs::launch::unmount(&args),
        Command::Serve(args) => shufflefs::launch::serve(args),
        Command::Status(args) => shufflefs::jobtable::run(&args),
        Command::Plan(args) => {
            match shufflefs::coded::calc::report(&shufflefs::config::plan_input(&args)) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("shufflefs plan: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
