//! Files the simulator writes on the real host (sweep records, capsules).

use std::path::Path;

/// Creates `path` and its directory.
pub fn create_file(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::File::create(path)
}
