//! Reading the configuration file: a regular file of bounded size. A FIFO or a device would
//! block or never end (a FIFO without a writer blocks `open` until one appears), and a huge file
//! would take the memory of the daemon that parses it.

use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest configuration file read, in bytes (16 MiB: some hundred thousand zones).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The text of the configuration file at `path`. Refused (`InvalidInput`) if it is not a
/// regular file or is larger than [`MAX_CONFIG_BYTES`]; `InvalidData` if it is not UTF-8.
pub fn read(path: &Path) -> io::Result<String> {
    // O_NONBLOCK: opening a FIFO without a writer returns at once (then it is refused below);
    // reads of a regular file ignore the flag.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {what}: the configuration must be a regular file"),
        ));
    }
    let too_big = |len: u64| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{len} bytes or more: larger than the limit of {MAX_CONFIG_BYTES} bytes (16 MiB)"),
        )
    };
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_big(meta.len()));
    }
    // The file may grow after the stat: read one byte past the limit to tell.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("not UTF-8 ({e})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of the test's own (removed at its end).
    fn dir(test: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("lb-config-file-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_fifo_without_writer_is_refused_at_once() {
        let dir = dir("fifo");
        let path = dir.join("fifo.toml");
        let _ = std::fs::remove_file(&path);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{}", io::Error::last_os_error());
        let err = read(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("a FIFO") && err.to_string().contains("regular file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_over_the_limit_and_directories_are_refused() {
        let dir = dir("big");
        let path = dir.join("big.toml");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("larger than the limit") && err.contains("16 MiB"), "{err}");
        f.set_len(MAX_CONFIG_BYTES).unwrap();
        assert_eq!(read(&path).unwrap().len() as u64, MAX_CONFIG_BYTES);
        std::fs::remove_file(&path).unwrap();
        assert!(read(&dir).unwrap_err().to_string().contains("a directory"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
