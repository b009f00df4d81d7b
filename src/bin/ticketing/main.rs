//! `ticketing`: the command line of the Ticketing lock service. A thin shell
//! over the library; every rule lives there. The interface is CLI.md's.

mod client;
mod cluster;
mod common;
mod demo;
mod demo_raft;
mod input;
mod member;
mod report;
mod run;
mod scrape;
mod serve;
mod sim;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Ticketing: locks with fencing tokens.
#[derive(Parser)]
#[command(name = "ticketing", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the reference server until SIGINT or SIGTERM.
    Serve(serve::Args),
    /// Drive a client with commands on stdin, JSON lines on stdout.
    Client(client::Args),
    /// Administer a replicated cluster: status, leadership transfer.
    Cluster(cluster::Args),
    /// Hold a lock while a command runs.
    Run(run::Args),
    /// Servers and many clients for a few seconds, with faults; a report.
    Demo(demo::Args),
    /// The deterministic simulator over many seeds; a report.
    Sim(sim::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` runs one task that owns the server core and its sockets: a
    // single-threaded runtime spares it the hand-offs between worker
    // threads. The other subcommands run many tasks at once.
    let mut builder = match cli.command {
        Command::Serve(_) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ticketing: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => runtime.block_on(serve::run(args)),
        Command::Client(args) => runtime.block_on(client::run(args)),
        Command::Cluster(args) => runtime.block_on(cluster::run(args)),
        Command::Run(args) => runtime.block_on(run::run(args)),
        Command::Demo(args) => runtime.block_on(demo::run(args)),
        Command::Sim(args) => runtime.block_on(sim::run(args)),
    };
    // Nothing a subcommand starts is left to finish once it returns, but a
    // read of standard input may still be under way: `client` stopped by a
    // signal or a `shutdown` line while its input stays open. tokio reads
    // it on a blocking thread that nothing interrupts, and dropping the
    // runtime would wait for that read.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ticketing: {e}");
            ExitCode::FAILURE
        }
    }
}
