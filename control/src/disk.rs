//! The workspace's disk quota, enforced by the filesystem: the workspace is an ext4 image
//! (`disk.img` in the workspace directory, sparse, made on first use) mounted through a loop
//! device for each run, so writing past its size fails with ENOSPC inside the sandbox, and the
//! work survives from one run to the next.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The image's name inside the workspace directory.
const IMAGE: &str = "disk.img";

/// A mounted workspace image; unmounted (and its loop device freed) by [`Mounted::unmount`].
#[derive(Debug)]
pub(crate) struct Mounted {
    pub(crate) mountpoint: PathBuf,
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`{program} {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Makes (first time) and mounts the workspace image of `size` bytes at `mountpoint`.
pub(crate) fn mount(workspace: &Path, size: u64, mountpoint: &Path) -> Result<Mounted, String> {
    std::fs::create_dir_all(workspace).map_err(|e| format!("workspace {}: {e}", workspace.display()))?;
    let image = workspace.join(IMAGE);
    if !image.exists() {
        let f = std::fs::File::create(&image).map_err(|e| format!("{}: {e}", image.display()))?;
        f.set_len(size).map_err(|e| format!("{}: {e}", image.display()))?;
        let img = image.to_string_lossy().into_owned();
        if let Err(e) = run("mkfs.ext4", &["-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-m", "0", &img])
        {
            let _ = std::fs::remove_file(&image);
            return Err(format!("{e}; install e2fsprogs"));
        }
    } else if let Ok(meta) = std::fs::metadata(&image)
        && meta.len() != size
    {
        tracing::warn!(image = %image.display(), "the workspace image keeps its size of {} MiB (asked {} MiB)", meta.len() >> 20, size >> 20);
    }
    std::fs::create_dir_all(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let (img, mnt) = (image.to_string_lossy().into_owned(), mountpoint.to_string_lossy().into_owned());
    run("mount", &["-o", "loop,nosuid,nodev", &img, &mnt])?;
    Ok(Mounted { mountpoint: mountpoint.to_owned() })
}

/// Where run `id`'s workspace image is mounted on the host.
pub(crate) fn mountpoint(state_dir: &Path, id: &str) -> PathBuf {
    state_dir.join("mnt").join(format!("sandgate-{id}"))
}

// === impl Mounted ===

impl Mounted {
    /// Unmounts (the loop device goes with it) and removes the mount point.
    pub(crate) fn unmount(self) {
        unmount_dir(&self.mountpoint);
    }
}

/// Unmounts whatever is at `dir` (lazily if busy) and removes the directory.
pub(crate) fn unmount_dir(dir: &Path) {
    let d = dir.to_string_lossy().into_owned();
    if run("umount", &[&d]).is_err() {
        let _ = run("umount", &["-l", &d]);
    }
    let _ = std::fs::remove_dir(dir);
}
