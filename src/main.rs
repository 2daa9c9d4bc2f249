//! The `gpumem-top` binary: parses the command line and runs one mode.
#![deny(clippy::unwrap_used)]

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use gpumem_top::cli;

/// A terminal GPU memory profiler: live allocated-vs-reserved bars, a
/// fragmentation map and a timeline of peaks, over a faithful model of
/// PyTorch's CUDA caching allocator.
#[derive(Parser, Debug)]
#[command(name = "gpumem-top", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    live: cli::WatchArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Watch live GPUs (NVML) and the PyTorch processes that publish their state.
    Live(cli::WatchArgs),
    /// The simulated device with a synthetic workload.
    Demo,
    /// Replay a PyTorch memory snapshot (or our JSONL, or an RMM log) through the allocator.
    Replay(cli::ReplayArgs),
    /// Drive the caching allocator with a synthetic training loop (GPU or simulated).
    Synth(cli::SynthArgs),
    /// Write a view of a trace as SVG, PNG or text.
    Export(cli::ExportArgs),
    /// Sample live state headless into a JSON-lines file (`replay` shows it).
    Record(cli::RecordArgs),
    /// Serve Prometheus metrics on /metrics.
    Serve(cli::ServeArgs),
    /// Predict peak memory at other batch sizes, and the largest batch that fits, from two small runs.
    Fit(cli::FitArgs),
    /// Start a training command with the publisher injected (no code change) and watch it.
    Run(cli::RunArgs),
    /// Ask a publishing process for a PyTorch memory snapshot and write it here.
    Snapshot(cli::SnapshotArgs),
    /// Start publishing in a running Python 3.14+ process (sys.remote_exec) and watch it.
    Attach(cli::AttachArgs),
    /// Which PYTORCH_CUDA_ALLOC_CONF for this run: every setting replayed on its requests, ranked.
    Tune(cli::TuneArgs),
    /// What changed between two runs: peaks, what grew where (call site, category), a CI gate.
    Diff(cli::DiffArgs),
}

/// The simulated device with the built-in training loop, under a banner that
/// says so: nothing shows simulated numbers without saying so.
fn demo(banner: &str) -> ExitCode {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        eprintln!("gpumem-top: the interactive view needs a terminal (for scripts: `gpumem-top replay TRACE --json`)");
        return ExitCode::from(2);
    }
    let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut app = gpumem_top::ui::app::DemoApp::demo(42, banner.to_string(), color);
    match gpumem_top::ui::event::run_app(&mut app, gpumem_top::ui::event::Events::new()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpumem-top: terminal: {e}");
            ExitCode::from(1)
        }
    }
}

/// The banner over the simulated device when NVML finds no GPU.
const NO_GPU: &str = "no NVIDIA GPU found: simulated device";

/// An option of the live view given before another subcommand
/// (`gpumem-top --json replay X`) would be dropped silently: say where it goes.
fn misplaced_option(m: &clap::ArgMatches) -> Option<String> {
    let (sub, _) = m.subcommand()?;
    if sub == "live" {
        return None;
    }
    let cmd = Cli::command();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if m.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
            let flag = arg.get_long().map_or_else(|| id.to_string(), |l| format!("--{l}"));
            let takes_it = cmd
                .find_subcommand(sub)
                .is_some_and(|s| s.get_arguments().any(|a| a.get_long().is_some() && a.get_long() == arg.get_long()));
            let fix = if takes_it {
                format!("put it after the subcommand: gpumem-top {sub} ... {flag}")
            } else {
                format!("`{sub}` has no {flag}")
            };
            return Some(format!("{flag} before `{sub}` belongs to the live view and would be ignored; {fix}"));
        }
    }
    None
}

/// Bad usage in one line and exit 2, as every other bad input (clap's own
/// error spans three lines with a usage block); help and the version print
/// as clap prints them.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit()
    }
    let text = e.render().to_string();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("bad usage");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    eprintln!("gpumem-top: {} (--help lists the options)", gpumem_top::trace::printable::escape(first));
    ExitCode::from(2)
}

fn main() -> ExitCode {
    // `run` and `attach` share the live view's sampling options; its
    // `--source` they refuse, so their help does not offer it.
    let hide = |c: clap::Command| c.mut_arg("source", |a| a.hide(true));
    let matches = match Cli::command().mut_subcommand("run", hide).mut_subcommand("attach", hide).try_get_matches() {
        Ok(m) => m,
        Err(e) => return usage_error(e),
    };
    if let Some(e) = misplaced_option(&matches) {
        eprintln!("gpumem-top: {e}");
        return ExitCode::from(2);
    }
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        None => cli::live(&cli.live, NO_GPU),
        Some(Command::Live(args)) => cli::live(&args, NO_GPU),
        Some(Command::Demo) => return demo("demo: simulated device"),
        Some(Command::Synth(args)) => cli::synth(&args),
        Some(Command::Export(args)) => cli::export(&args),
        Some(Command::Record(args)) => cli::record(&args),
        Some(Command::Serve(args)) => cli::serve(&args),
        Some(Command::Replay(args)) => cli::replay(&args),
        Some(Command::Fit(args)) => cli::fit(&args),
        Some(Command::Run(args)) => cli::run(&args),
        Some(Command::Snapshot(args)) => cli::snapshot(&args),
        Some(Command::Attach(args)) => cli::attach(&args),
        Some(Command::Tune(args)) => cli::tune(&args),
        Some(Command::Diff(args)) => cli::diff(&args),
    };
    match result {
        Ok(code) => code,
        // `replay X | head`: the reader is gone, and so is whom we would
        // tell; quiet, as other tools are.
        Err(e) if cli::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpumem-top: {}", gpumem_top::trace::printable::escape(&format!("{e:#}")));
            ExitCode::from(cli::exit_code(&e))
        }
    }
}
