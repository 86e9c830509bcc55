//! `state.json` beside the control socket: what a restarted daemon adopts (ids, health,
//! overrides, drains). The root daemon writes it, so its directory must be one only root can
//! write: in a world-writable directory a planted symlink would redirect the write to any file.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The state file of the daemon whose control socket is `socket`.
pub fn path_for(socket: &Path) -> PathBuf {
    socket.parent().unwrap_or(Path::new("/run/lb")).join("state.json")
}

/// Creates `dir` (mode 0755) if missing, and refuses it when someone other than this user
/// (root) owns it or when group or others may write it: the daemon creates its socket, state
/// file and temporary file there.
pub fn check_dir(dir: &Path) -> Result<()> {
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let meta = std::fs::metadata(dir).with_context(|| format!("the control socket's directory {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("the control socket's directory {} is not a directory", dir.display());
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        bail!("the control socket's directory {} is owned by uid {}, not by the daemon's uid {me}; use a directory of the daemon's own (--socket)", dir.display(), meta.uid());
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        bail!(
            "the control socket's directory {} is writable by group or others (mode {mode:04o}); the state file is written there: use a directory only its owner can write (e.g. chmod 0755) or another --socket",
            dir.display()
        );
    }
    Ok(())
}

/// Writes `text` to `path` atomically: into a temporary file beside it that is created anew
/// (`O_EXCL | O_NOFOLLOW`, mode 0600: an existing file or symlink of that name is unlinked,
/// never written through), then renamed over `path`.
pub fn save(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
    };
    let mut file = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // A leftover of a crash, or something planted: unlinking removes the name only.
            std::fs::remove_file(&tmp).with_context(|| format!("removing the stale {}", tmp.display()))?;
            open()
        }
        other => other,
    }
    .with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_data())
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(file);
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Moves an unreadable state file aside, to `state.json.bad-<unix seconds>` beside it, and
/// returns where it went (kept for a post-mortem, never read again).
pub fn quarantine(path: &Path) -> Result<PathBuf> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".bad-{secs}"));
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside)
        .with_context(|| format!("moving the unreadable {} to {}", path.display(), aside.display()))?;
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lb-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    #[test]
    fn a_planted_symlink_is_not_written_through() {
        let dir = test_dir("symlink");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let state = dir.join("state.json");
        std::os::unix::fs::symlink(&victim, dir.join("state.tmp")).unwrap();
        save(&state, "{\"ids\":1}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious", "the symlink's target is untouched");
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "{\"ids\":1}");
        assert!(!dir.join("state.tmp").exists());
        let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A symlink as state.json itself is replaced by the rename, its target untouched.
        std::fs::remove_file(&state).unwrap();
        std::os::unix::fs::symlink(&victim, &state).unwrap();
        save(&state, "{\"ids\":2}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!std::fs::symlink_metadata(&state).unwrap().file_type().is_symlink());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let dir = test_dir("mode");
        assert!(check_dir(&dir).is_ok());
        for mode in [0o777, 0o1777, 0o775] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = format!("{:#}", check_dir(&dir).unwrap_err());
            assert!(
                err.contains(&dir.display().to_string())
                    && err.contains("writable by group or others")
                    && err.contains(&format!("{mode:04o}")),
                "{err}"
            );
        }
        let missing = dir.join("sub/run");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_dir(&missing).unwrap();
        assert_eq!(std::fs::metadata(&missing).unwrap().permissions().mode() & 0o777, 0o755);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
