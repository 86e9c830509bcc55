//! `lb manpage --dir DIR` (hidden; the package build runs it): the man pages, one per command
//! (`lb.8`, `lb-run.8`, `lb-backend.8`, `lb-backend-set.8`, ...), from the clap definition, so
//! that every `lb-*(8)` page `lb.8` names exists.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Writes the page of `cmd` and of each of its subcommands, recursively, into `dir`; returns
/// the files written.
pub fn write_all(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    write(cmd.version(None::<&str>).long_version(None::<&str>), dir, &mut written)?;
    Ok(written)
}

fn write(cmd: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> Result<()> {
    // No `help` subcommand in the pages: it would be named in SEE ALSO (lb-help(8)) without a
    // page of its own.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_owned();
    let path = dir.join(format!("{name}.8"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).section("8").render(&mut page)?;
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        write(sub.clone(), dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_gets_a_page_and_the_pages_name_only_written_ones() {
        let cmd = clap::Command::new("lb")
            .subcommand(clap::Command::new("run").about("Run"))
            .subcommand(clap::Command::new("backend").subcommand(clap::Command::new("set")))
            .subcommand(clap::Command::new("manpage").hide(true));
        let dir = std::env::temp_dir().join(format!("lb-man-{}", std::process::id()));
        let written = write_all(cmd, &dir).unwrap();
        let names: Vec<String> =
            written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["lb.8", "lb-run.8", "lb-backend.8", "lb-backend-set.8"]);
        let top = std::fs::read_to_string(dir.join("lb.8")).unwrap();
        assert!(top.contains("lb\\-run(8)") && top.contains("lb\\-backend(8)"), "{top}");
        assert!(!top.contains("lb\\-help(8)") && !top.contains("lb\\-manpage(8)"), "{top}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
