//! `leasehold`: the one binary that migrates, serves and measures the Leasehold ledger.

mod backend_sim;
mod bench;
mod cli;
mod cluster;
mod database;
mod demo;
mod dispatch;
mod events;
mod projections;
mod projectors;
mod relay;
mod sealer;
mod secrets;
mod serve;
mod token;

use clap::Parser;

/// The command pipeline and the store allocate many small, short-lived values per command;
/// mimalloc serves them with less CPU than the system allocator (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    cli::init_logging(&cli.log_format);
    match cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
