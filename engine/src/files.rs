//! Files written whole or not at all: a crash, a full disk or a failed write leaves the file
//! that was there before (or none), never a truncated one.

use std::io::Write;
use std::path::Path;

/// The suffix of the temporary files [`write_atomically`] writes beside their target: what
/// an interrupted write leaves behind ends in it.
pub const TEMPORARY_SUFFIX: &str = ".tmp";

/// Checks, before any work whose result goes to `path`, that [`write_atomically`] can write
/// there: `path` is not a folder and its folder exists and takes new files.
pub fn check_writable(path: &Path) -> std::io::Result<()> {
    if path.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "it is a folder; name a file",
        ));
    }
    if std::fs::symlink_metadata(path).is_ok_and(|meta| !meta.file_type().is_file()) {
        return std::fs::OpenOptions::new().append(true).open(path).map(drop);
    }
    let dir = folder_of(path);
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("the folder {} does not exist", dir.display()),
        ));
    }
    tempfile::Builder::new()
        .prefix(".")
        .suffix(TEMPORARY_SUFFIX)
        .tempfile_in(dir)
        .map(drop)
        .map_err(|e| std::io::Error::new(e.kind(), format!("the folder {} takes no new file: {e}", dir.display())))
}

/// The folder a file `path` lies in.
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder, synced, then renamed
/// over `path` (and on Unix the folder synced, so that the rename itself is durable). The
/// file gets the modes a plain write would give it: those of the file it replaces, or the
/// umask's for a new one. A path that names something other than a regular file (a device
/// such as `/dev/null`, a pipe, a link) is written through in place: renaming over it would
/// replace it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::symlink_metadata(path).is_ok_and(|meta| !meta.file_type().is_file()) {
        return std::fs::write(path, bytes);
    }
    write_through_temporary(path, |file| file.write_all(bytes))
}

/// [`write_atomically`] for a regular file: `write` fills the temporary file; if it fails,
/// the temporary file is removed and `path` keeps what it held.
fn write_through_temporary(
    path: &Path,
    write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = folder_of(path);
    let mut builder = tempfile::Builder::new();
    builder.prefix(".").suffix(TEMPORARY_SUFFIX);
    // The modes a plain write gives: those of the file replaced, else 0o666 less the umask
    // (tempfile's default, 0o600, would hide a new WAV from everyone else).
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut file = builder.tempfile_in(dir)?;
    if let Ok(replaced) = std::fs::metadata(path) {
        file.as_file().set_permissions(replaced.permissions())?;
    }
    write(file.as_file_mut())?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    // Windows cannot open a folder as a file.
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.wav");
        std::fs::write(&path, b"old contents, longer than the new").unwrap();
        write_atomically(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.wav")]);
    }

    #[cfg(unix)]
    #[test]
    fn modes_are_those_of_a_plain_write() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain.wav");
        std::fs::write(&plain, b"plain").unwrap();
        let fresh = dir.path().join("fresh.wav");
        write_atomically(&fresh, b"new").unwrap();
        assert_eq!(mode(&fresh), mode(&plain), "a new file gets the umask's modes");
        for kept in [0o640, 0o604, 0o755] {
            let replaced = dir.path().join(format!("replaced-{kept:o}.wav"));
            std::fs::write(&replaced, b"old").unwrap();
            std::fs::set_permissions(&replaced, std::fs::Permissions::from_mode(kept)).unwrap();
            write_atomically(&replaced, b"new").unwrap();
            assert_eq!(mode(&replaced), kept, "a replaced file keeps its modes");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_link_is_written_through_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.wav");
        std::fs::write(&target, b"old").unwrap();
        let link = dir.path().join("link.wav");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_atomically(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
    }

    #[test]
    fn check_writable_names_what_is_wrong_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("out.wav");
        check_writable(&file).unwrap();
        assert!(!file.exists());
        std::fs::write(&file, b"old").unwrap();
        check_writable(&file).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"old");
        let folder = check_writable(dir.path()).unwrap_err();
        assert_eq!(folder.kind(), std::io::ErrorKind::IsADirectory);
        assert!(folder.to_string().contains("it is a folder"), "{folder}");
        let missing = dir.path().join("nowhere").join("out.wav");
        let error = check_writable(&missing).unwrap_err().to_string();
        assert!(
            error.contains(&format!(
                "the folder {} does not exist",
                missing.parent().unwrap().display()
            )),
            "{error}"
        );
        #[cfg(unix)]
        check_writable(Path::new("/dev/null")).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.wav")]);
    }

    /// A write that fails halfway (as on a full disk) leaves the file it was replacing as it
    /// was, and no temporary file behind.
    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.wav");
        std::fs::write(&path, b"old contents").unwrap();
        let err = write_through_temporary(&path, |file| {
            file.write_all(b"new, but only")?;
            Err(std::io::Error::other("no space left on the device"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "no space left on the device");
        assert_eq!(std::fs::read(&path).unwrap(), b"old contents");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.wav")]);
    }
}
