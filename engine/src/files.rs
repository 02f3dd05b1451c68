//! Files a node reads at start (its configuration, TLS certificates and
//! keys): each must be a regular file of bounded size, checked before it
//! is opened for reading, so that a FIFO, a device such as `/dev/zero` or
//! a huge file named by mistake stops the node with an error naming the
//! key instead of hanging it or exhausting its memory.

use crate::error::{Error, Result};
use std::io::Read;
use std::path::Path;

/// Largest configuration file read: 1 MiB (a configuration listing
/// thousands of containers and clients stays far below it).
pub const CONFIG_FILE_BYTES_MAX: u64 = 1 << 20;

/// Largest TLS file read (a CA bundle, a certificate chain, a key): 1 MiB.
pub const TLS_FILE_BYTES_MAX: u64 = 1 << 20;

/// The bytes of the regular file at `path`, at most `max_bytes` of them.
/// Errors are `Error::Config("KEY: PATH: why")`.
pub fn read_regular(key: &str, path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let bad = |why: String| Error::Config(format!("{key}: {}: {why}", path.display()));
    let regular = |meta: &std::fs::Metadata| {
        if meta.is_file() {
            Ok(())
        } else if meta.is_dir() {
            Err(bad("is a directory".into()))
        } else {
            Err(bad("not a regular file (a FIFO, socket or device)".into()))
        }
    };
    // Before opening: opening a FIFO for reading waits for a writer.
    regular(&std::fs::metadata(path).map_err(|e| bad(e.to_string()))?)?;
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    // Again on what was opened, in case the path changed in between.
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    regular(&meta)?;
    if meta.len() > max_bytes {
        return Err(bad(format!(
            "{} bytes, more than the {max_bytes} a file may have here",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(e.to_string()))?;
    if bytes.len() as u64 > max_bytes {
        return Err(bad(format!(
            "grew past the {max_bytes} bytes a file may have here while read"
        )));
    }
    Ok(bytes)
}

/// `read_regular` as UTF-8 text.
pub fn read_regular_text(key: &str, path: &Path, max_bytes: u64) -> Result<String> {
    let bytes = read_regular(key, path, max_bytes)?;
    String::from_utf8(bytes)
        .map_err(|_| Error::Config(format!("{key}: {}: not UTF-8 text", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_of_bounded_size_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, b"0123456789").unwrap();
        assert_eq!(read_regular("k", &small, 10).unwrap(), b"0123456789");
        let error = read_regular("node.tls.ca", &small, 9)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("node.tls.ca") && error.contains("10 bytes"),
            "{error}"
        );
        let error = read_regular("k", dir.path(), 10).unwrap_err().to_string();
        assert!(error.contains("is a directory"), "{error}");
        // A device that never ends and a FIFO nobody writes to: refused at
        // once, neither read to the end nor waited on.
        let error = read_regular("node.tls.ca", Path::new("/dev/zero"), 10).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success(), "mkfifo");
        let error = read_regular("node.tls.ca", &fifo, 10).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        let missing = dir.path().join("missing");
        let error = read_regular("node.tls.key", &missing, 10).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("invalid configuration: node.tls.key: "),
            "{error}"
        );
    }
}
