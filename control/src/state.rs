//! Sandbox state in an embedded SQLite database (WAL): each sandbox's id, provider, state,
//! owner process, times, limits and the resources made for it. The intent is written before
//! anything is created, so a crash mid-creation leaves a record the reaper can act on.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, params};

/// Schema version 1, created when the database is new.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandboxes (
    id          TEXT PRIMARY KEY,
    provider    TEXT NOT NULL,
    state       TEXT NOT NULL,      -- creating | running | paused | stopped | reaped
    owner_pid   INTEGER NOT NULL,
    owner_start INTEGER NOT NULL,   -- the owner's start time in clock ticks, against pid reuse
    created_at  INTEGER NOT NULL,   -- unix seconds
    expires_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    cause       TEXT,               -- exited | oom_killed | pids_limit | lifetime_expired | removed | owner_died | expired
    cpus        REAL NOT NULL,
    memory      INTEGER NOT NULL,
    pids        INTEGER NOT NULL,
    netns       TEXT NOT NULL,
    nft_table   TEXT NOT NULL,
    workspace   TEXT NOT NULL,
    exit_code   INTEGER
);
";

/// Migrations after version 1, in order; `user_version` counts how many have run (plus one).
const MIGRATIONS: &[&str] = &[
    // 2: the explicit proxy's URL, for `sandbox exec`.
    "ALTER TABLE sandboxes ADD COLUMN proxy TEXT",
    // 3: the isolation (bwrap or gvisor), since `sandbox exec` enters bwrap sandboxes only.
    "ALTER TABLE sandboxes ADD COLUMN isolation TEXT",
];

/// The state database.
#[derive(Debug)]
pub(crate) struct State {
    db: Connection,
}

/// One sandbox's row.
#[derive(Debug, Clone)]
pub(crate) struct SandboxRow {
    pub(crate) id: String,
    pub(crate) state: String,
    pub(crate) owner_pid: i64,
    pub(crate) owner_start: i64,
    pub(crate) expires_at: i64,
    pub(crate) netns: String,
    pub(crate) nft_table: String,
}

/// A live sandbox's (owner pid, proxy URL, isolation).
pub(crate) type Owner = (i64, Option<String>, Option<String>);

/// A row of `sandbox ls`: (id, state, cause, created_at, expires_at, owner_pid, workspace).
pub(crate) type Listed = (String, String, Option<String>, i64, i64, i64, String);

/// Seconds since the epoch.
pub(crate) fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A process's start time (field 22 of /proc/PID/stat), to tell a live owner from a reused pid.
pub(crate) fn process_start(pid: i64) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The default state directory.
pub(crate) fn default_dir() -> PathBuf {
    PathBuf::from("/var/lib/sandgate")
}

fn sql(e: rusqlite::Error) -> String {
    format!("state database: {e}")
}

// === impl State ===

impl State {
    /// Opens (creating) the database in `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("state directory {}: {e}", dir.display()))?;
        let db = Connection::open(dir.join("state.db")).map_err(sql)?;
        db.busy_timeout(Duration::from_secs(5)).map_err(sql)?;
        db.pragma_update(None, "journal_mode", "WAL").map_err(sql)?;
        db.pragma_update(None, "synchronous", "NORMAL").map_err(sql)?;
        db.execute_batch(SCHEMA).map_err(sql)?;
        let version: i64 = db.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(sql)?;
        for (i, migration) in MIGRATIONS.iter().enumerate() {
            let target = i64::try_from(i).unwrap_or(i64::MAX) + 2;
            if version < target {
                let tx = db.unchecked_transaction().map_err(sql)?;
                // A database made before versions were recorded may already have the column.
                if let Err(e) = tx.execute_batch(migration)
                    && !e.to_string().contains("duplicate column")
                {
                    return Err(sql(e));
                }
                tx.pragma_update(None, "user_version", target).map_err(sql)?;
                tx.commit().map_err(sql)?;
            }
        }
        Ok(Self { db })
    }

    /// Records the intent to create a sandbox, before anything is made.
    #[expect(clippy::too_many_arguments, reason = "one row's columns")]
    pub(crate) fn intend(
        &self,
        id: &str,
        lifetime: Duration,
        cpus: f64,
        memory: u64,
        pids: u64,
        netns: &str,
        nft_table: &str,
        workspace: &Path,
    ) -> Result<(), String> {
        let pid = i64::from(std::process::id());
        let start = process_start(pid).unwrap_or(0);
        let created = now();
        let expires = created.saturating_add(i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX));
        self.db
            .execute(
                "INSERT INTO sandboxes (id, provider, state, owner_pid, owner_start, created_at, expires_at, cpus, memory, pids, netns, nft_table, workspace)
                 VALUES (?1, 'local', 'creating', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    id,
                    pid,
                    start,
                    created,
                    expires,
                    cpus,
                    i64::try_from(memory).unwrap_or(i64::MAX),
                    i64::try_from(pids).unwrap_or(i64::MAX),
                    netns,
                    nft_table,
                    workspace.to_string_lossy()
                ],
            )
            .map(|_| ())
            .map_err(sql)
    }

    /// Records the sandbox's explicit proxy URL.
    pub(crate) fn set_proxy(&self, id: &str, url: &str) -> Result<(), String> {
        self.db.execute("UPDATE sandboxes SET proxy = ?2 WHERE id = ?1", params![id, url]).map(|_| ()).map_err(sql)
    }

    /// Records the sandbox's isolation.
    pub(crate) fn set_isolation(&self, id: &str, isolation: &str) -> Result<(), String> {
        self.db
            .execute("UPDATE sandboxes SET isolation = ?2 WHERE id = ?1", params![id, isolation])
            .map(|_| ())
            .map_err(sql)
    }

    /// A live sandbox's owner pid, proxy URL and isolation.
    pub(crate) fn owner_and_proxy(&self, id: &str) -> Result<Option<Owner>, String> {
        use rusqlite::OptionalExtension;
        self.db
            .query_row(
                "SELECT owner_pid, proxy, isolation FROM sandboxes WHERE id = ?1 AND state IN ('running', 'paused')",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(sql)
    }

    /// The id of the live sandbox owned by process `pid`, if any.
    pub(crate) fn owned_by(&self, pid: u32) -> Result<Option<String>, String> {
        use rusqlite::OptionalExtension;
        self.db
            .query_row(
                "SELECT id FROM sandboxes WHERE owner_pid = ?1 AND state = 'running'",
                params![i64::from(pid)],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql)
    }

    /// Moves a sandbox to `state`.
    pub(crate) fn set_state(&self, id: &str, state: &str) -> Result<(), String> {
        self.db.execute("UPDATE sandboxes SET state = ?2 WHERE id = ?1", params![id, state]).map(|_| ()).map_err(sql)
    }

    /// Records how a sandbox ended.
    pub(crate) fn end(&self, id: &str, state: &str, cause: &str, exit_code: Option<i32>) -> Result<(), String> {
        self.db
            .execute(
                "UPDATE sandboxes SET state = ?2, cause = ?3, exit_code = ?4, ended_at = ?5 WHERE id = ?1",
                params![id, state, cause, exit_code, now()],
            )
            .map(|_| ())
            .map_err(sql)
    }

    /// Sandboxes not yet ended (creating or running).
    pub(crate) fn live(&self) -> Result<Vec<SandboxRow>, String> {
        let mut stmt = self
            .db
            .prepare("SELECT id, state, owner_pid, owner_start, expires_at, netns, nft_table FROM sandboxes WHERE state IN ('creating', 'running', 'paused')")
            .map_err(sql)?;
        let rows = stmt
            .query_map([], |r| {
                Ok(SandboxRow {
                    id: r.get(0)?,
                    state: r.get(1)?,
                    owner_pid: r.get(2)?,
                    owner_start: r.get(3)?,
                    expires_at: r.get(4)?,
                    netns: r.get(5)?,
                    nft_table: r.get(6)?,
                })
            })
            .map_err(sql)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(sql)
    }

    /// Every sandbox, newest first.
    pub(crate) fn list(&self) -> Result<Vec<Listed>, String> {
        let mut stmt = self
            .db
            .prepare("SELECT id, state, cause, created_at, expires_at, owner_pid, workspace FROM sandboxes ORDER BY created_at DESC")
            .map_err(sql)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)))
            .map_err(sql)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(sql)
    }

    /// One sandbox's state and cause.
    pub(crate) fn status(&self, id: &str) -> Result<Option<(String, Option<String>)>, String> {
        use rusqlite::OptionalExtension;
        self.db
            .query_row("SELECT state, cause FROM sandboxes WHERE id = ?1", params![id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .map_err(sql)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intent_then_end_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let s = State::open(dir.path()).unwrap();
        s.intend("abc", Duration::from_secs(60), 2.0, 1 << 30, 100, "sandgate-abc", "sandgate-abc", dir.path())
            .unwrap();
        let live = s.live().unwrap();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].state, "creating");
        assert_eq!(live[0].owner_pid, i64::from(std::process::id()));
        assert_eq!(Some(live[0].owner_start), process_start(i64::from(std::process::id())));
        s.set_state("abc", "running").unwrap();
        s.end("abc", "stopped", "exited", Some(0)).unwrap();
        assert!(s.live().unwrap().is_empty());
        assert_eq!(s.status("abc").unwrap(), Some(("stopped".into(), Some("exited".into()))));
        // Reopening keeps it (a real file, WAL mode), and migrations do not run twice.
        drop(s);
        let s = State::open(dir.path()).unwrap();
        assert_eq!(s.status("abc").unwrap().unwrap().0, "stopped");
        let version: i64 = s.db.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(version, 3);
    }

    #[test]
    fn a_version_1_database_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let db = Connection::open(dir.path().join("state.db")).unwrap();
        db.execute_batch(SCHEMA).unwrap();
        drop(db);
        let s = State::open(dir.path()).unwrap();
        s.intend("v1", Duration::from_secs(60), 1.0, 1, 1, "n", "t", dir.path()).unwrap();
        s.set_proxy("v1", "http://10.0.0.1:1").unwrap();
    }
}
