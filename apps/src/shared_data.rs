//! Locating the project's shared data files (SPLASH's `random.in`, …), which are read
//! from a path and never copied into the repository.
//!
//! Looked up, in order: the directory named by `$MULTIGRAIN_SHARED_DATA`, then
//! `shared/data/` in the workspace's parent directory and its ancestors (a checkout sits
//! next to the project's `shared/` folder).

use std::path::{Path, PathBuf};

/// Environment variable naming the shared data directory explicitly.
pub const ENV: &str = "MULTIGRAIN_SHARED_DATA";

/// The path of shared data file `name`, searched from the workspace at `workspace`.
///
/// # Errors
/// A message listing every place looked at, when the file is in none of them.
pub fn find(workspace: &Path, name: &str) -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    if let Some(dir) = std::env::var_os(ENV) {
        let p = PathBuf::from(dir).join(name);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p);
    }
    for dir in workspace.ancestors().skip(1) {
        let p = dir.join("shared/data").join(name);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p);
    }
    Err(format!(
        "shared data file {name} not found; looked at {} (set {ENV} to the directory holding it)",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_name_every_place_looked_at() {
        let err = find(Path::new("/nonexistent/ws"), "no-such-file.in").unwrap_err();
        assert!(
            err.contains("/nonexistent/shared/data/no-such-file.in") && err.contains(ENV),
            "{err}"
        );
    }
}
