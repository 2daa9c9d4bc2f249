//! Screens a screen opens over itself from a file: a snapshot's replay
//! (the live view's `S`, a rank's Enter).

use std::path::Path;

use anyhow::Result;

use super::io::{load_tapped, trace_name};
use crate::replay::ahead::Ahead;
use crate::replay::session::Start;
use crate::replay::OpenOptions;
use crate::trace::input::Input;
use crate::trace::Trace;

/// A screen another asks to open over itself: a snapshot's replay (the
/// live view's `S`, a rank's Enter), built quietly (the terminal is the
/// screens'); what it says as it closes is its fidelity and events, and
/// what tuning found. An error is the status line's.
pub fn open_screen(
    what: crate::ui::event::Open,
    color: bool,
) -> std::result::Result<Box<dyn crate::ui::event::Interactive>, String> {
    let crate::ui::event::Open::Replay(path) = what;
    let input = Input::open(&path).map_err(|e| format!(" {e:#}"))?;
    // The replay and the scrubber's pass run behind the decoding where
    // they can (docs/design/trace-decoding.md).
    let opts = OpenOptions { scrub_every: Some(crate::replay::model::ReplayModel::STEPPING), ..OpenOptions::default() };
    let ahead = opts.ahead();
    let trace = load_tapped(input, None, false, ahead.as_ref().map(Ahead::tap)).map_err(|e| format!(" {e:#}"))?;
    let opened =
        crate::ui::app::OpenedReplay::new(trace, |trace| open_replay(&path, trace, &opts, ahead.as_ref(), color));
    match opened {
        Ok(screen) => Ok(Box::new(screen)),
        Err(e) => Err(format!(" {e:#}")),
    }
}

/// The replay app over `trace` (read from `path`), and what it tells the
/// screen under it on closing.
fn open_replay<'t>(
    path: &Path,
    trace: &'t Trace,
    opts: &OpenOptions,
    ahead: Option<&Ahead>,
    color: bool,
) -> Result<(crate::ui::app::ReplayApp<'t>, crate::ui::event::Closed)> {
    let mut opened = crate::replay::open_ahead(trace, &path.display().to_string(), opts, ahead)?;
    opened.require_exact("the screen shows only exact replays; `gpumem-top replay` on it says why")?;
    let fidelity = opened.session.fidelity;
    let dev = opened.dev;
    // What the live view's alerts quote from now on, instead of a hint no
    // replay checked (docs/user/tune.md).
    let tuned = (opened.session.start != Start::StateOnly).then(|| {
        let ask = crate::tune::Ask::of_run(&opened.want.config.source, opened.want.device_total, None);
        crate::tune::verdict(&crate::tune::search_session(&mut opened.session, &ask, None))
    });
    let model = opened.model(trace_name(path))?;
    let mut note = format!(" {} ({}, {} events) closed", path.display(), fidelity.name(), dev.events.len());
    if let Some(t) = &tuned {
        note.push_str(&format!("; {t}"));
    }
    Ok((crate::ui::app::ReplayApp::new(model, color), crate::ui::event::Closed { note, tuned }))
}
