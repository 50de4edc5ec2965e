//! `sandgate sandbox ls | pause | resume | rm`: managing local sandboxes that `sandgate run`
//! owns, through the state database and their cgroups.

use std::process::ExitCode;
use std::time::Duration;

use crate::limits;
use crate::state::{State, now, process_start};

/// Exit status for a sandbox that does not exist or is not in the right state.
const EXIT_NO_SANDBOX: u8 = 1;

/// Prints every sandbox, newest first.
pub(crate) fn ls(state: &State) -> ExitCode {
    match state.list() {
        Ok(rows) => {
            println!("{:<8} {:<9} {:<17} {:>8} {:>10}  WORKSPACE", "ID", "STATE", "CAUSE", "AGE", "EXPIRES IN");
            for (id, st, cause, created, expires, _, ws) in rows {
                let age = humantime::format_duration(Duration::from_secs(u64::try_from(now() - created).unwrap_or(0)));
                let left = if matches!(st.as_str(), "running" | "paused" | "creating") {
                    humantime::format_duration(Duration::from_secs(u64::try_from(expires - now()).unwrap_or(0)))
                        .to_string()
                } else {
                    "-".to_owned()
                };
                println!("{id:<8} {st:<9} {:<17} {age:>8} {left:>10}  {ws}", cause.unwrap_or_else(|| "-".into()));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandgate sandbox ls: {e}");
            ExitCode::from(EXIT_NO_SANDBOX)
        }
    }
}

/// Freezes or thaws a running sandbox; its processes and workspace are kept as they are.
pub(crate) fn pause(state: &State, id: &str, frozen: bool) -> ExitCode {
    let (from, to, verb) = if frozen { ("running", "paused", "paused") } else { ("paused", "running", "resumed") };
    match state.status(id) {
        Ok(Some((st, _))) if st == from => {}
        Ok(Some((st, _))) => {
            eprintln!("sandgate sandbox: {id} is {st}, not {from}");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
        Ok(None) => {
            eprintln!("sandgate sandbox: no sandbox {id}; `sandgate sandbox ls` lists them");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
        Err(e) => {
            eprintln!("sandgate sandbox: {e}");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
    }
    match limits::freeze(id, frozen).and_then(|()| state.set_state(id, to)) {
        Ok(()) => {
            eprintln!("sandgate sandbox: {id} {verb}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandgate sandbox: {e}");
            ExitCode::from(EXIT_NO_SANDBOX)
        }
    }
}

/// Stops a sandbox: its owner is asked to stop (SIGTERM) and cleans up; an owner that is gone
/// leaves it to the reaper, which runs here.
pub(crate) fn rm(state: &State, state_dir: &std::path::Path, id: &str) -> ExitCode {
    let live = state.live().unwrap_or_default();
    let Some(row) = live.into_iter().find(|r| r.id == id) else {
        eprintln!("sandgate sandbox: {id} is not running (`sandgate sandbox ls`)");
        return ExitCode::from(EXIT_NO_SANDBOX);
    };
    if process_start(row.owner_pid) == Some(row.owner_start)
        && let Some(pid) = i32::try_from(row.owner_pid).ok().and_then(rustix::process::Pid::from_raw)
    {
        let _ = limits::freeze(id, false);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        for _ in 0..200 {
            if !matches!(state.status(id), Ok(Some((ref s, _))) if matches!(s.as_str(), "running" | "paused" | "creating"))
            {
                eprintln!("sandgate sandbox: {id} removed");
                return ExitCode::SUCCESS;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for line in crate::reaper::reap(state, state_dir) {
        eprintln!("sandgate sandbox: removed {line}");
    }
    ExitCode::SUCCESS
}
