//! Command implementations behind `main`: each command file parses its
//! arguments, calls the library and prints. Here: the argument groups they
//! share (`args`), reading an input with a progress line, and the mapping
//! of errors to exit codes (0 ok, 1 runtime failure or a trace we do not
//! reproduce, 2 bad usage or bad input).

use std::process::ExitCode;

use anyhow::Result;

use crate::trace;

mod args;
mod diff;
mod export;
mod fit;
mod io;
mod live;
mod ranks;
mod replay;
mod run;
mod screen;
mod synth;
mod tune;
pub(crate) use args::InputError;
pub use diff::{diff, diff_app, DiffArgs};
pub use export::{export, ExportArgs};
pub use fit::{fit, FitArgs};
pub use live::{
    live, read_recording, read_recording_with, record, replay_recording, serve, LiveArgs, RecordArgs, ServeArgs,
    SourceKind, WatchArgs,
};
pub use ranks::ranks_app;
pub use replay::ReplayArgs;
pub use run::{attach, run, snapshot, AttachArgs, RunArgs, SnapshotArgs};
pub use screen::open_screen;
pub use synth::{synth, SynthArgs};
pub use tune::{tune, TuneArgs};

// The device's figures live with the devices (`device`), for `fit` and
// the replay as for the command line.
pub use crate::device::{CUDA_CONTEXT_BYTES, DEFAULT_DEVICE_TOTAL};

/// Whether `e` is a write to a closed pipe (stdout piped to `head`).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .is_some_and(|j| j.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
    })
}

/// The exit code of a failed command: what the library's typed errors say
/// of themselves, else 2 for bad usage or input and 1 for the rest.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    type Error = dyn std::error::Error + 'static;
    // Each typed error of the library that says its own code.
    let typed: [fn(&Error) -> Option<u8>; 7] = [
        |c| c.downcast_ref::<crate::replay::OpenError>().map(|e| e.exit_code()),
        |c| c.downcast_ref::<trace::input::InputError>().map(|e| e.exit_code()),
        |c| c.downcast_ref::<crate::monitor::recorder::RecorderError>().map(|e| e.exit_code()),
        |c| c.downcast_ref::<crate::fit::FitError>().map(|e| e.exit_code()),
        |c| c.downcast_ref::<crate::monitor::GpuError>().map(|e| e.exit_code()),
        |c| c.downcast_ref::<crate::monitor::recording::RecordingError>().map(|e| e.exit_code()),
        |c| c.downcast_ref::<crate::launch::AttachError>().map(|e| e.exit_code()),
    ];
    for c in e.chain() {
        if let Some(code) = typed.iter().find_map(|f| f(c)) {
            return code;
        }
        if c.is::<InputError>() || c.is::<trace::TraceError>() || c.is::<crate::alloc::ConfigError>() {
            return 2;
        }
    }
    1
}

/// `replay`: one input, or several ranks' side by side (docs/user/ranks.md).
pub fn replay(args: &ReplayArgs) -> Result<ExitCode> {
    if !args.more.is_empty() {
        return ranks::replay_ranks(args);
    }
    replay::replay_to(args, &mut io::text_out(), true)
}

#[cfg(test)]
mod tests {
    use super::exit_code;
    use anyhow::{anyhow, Context};

    /// The library's errors say their own exit code, under any context a
    /// command adds: 2 for the user's input, machine or flags, 1 for ours.
    #[test]
    fn typed_errors_say_their_exit_code_through_context() {
        let nvml: anyhow::Result<()> = Err(crate::monitor::GpuError::Nvml("Driver Not Loaded".into()).into());
        let e = nvml.context("--device 0").unwrap_err();
        assert_eq!(format!("{e:#}"), "--device 0: NVML: Driver Not Loaded");
        assert_eq!(exit_code(&e), 2);
        let rec = crate::monitor::recording::RecordingError { name: "r.jsonl".into(), line: 3, msg: "x".into() };
        assert_eq!(exit_code(&anyhow!(rec)), 2);
        assert_eq!(exit_code(&anyhow!(crate::launch::AttachError::NotOurs { pid: 1, uid: 0, me: 1000 })), 2);
        let not_exact = crate::replay::OpenError::NotExact {
            name: "t.pickle".into(),
            fidelity: "approximate",
            at: String::new(),
            need: "tune needs an exact replay",
        };
        assert_eq!(exit_code(&anyhow!(not_exact)), 1);
        assert_eq!(exit_code(&anyhow!(crate::fit::FitError::NotASample("a batch of 0".into()))), 2);
        assert_eq!(exit_code(&anyhow!("disk full")), 1);
    }
}
