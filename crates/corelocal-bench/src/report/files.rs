//! Writing the JSON, markdown and SVG files of a run.

use super::{svg_latency, svg_percentiles, svg_throughput, Report};
use crate::options::Common;
use std::path::{Path, PathBuf};

fn sibling(p: &Path, ext: &str) -> PathBuf {
    p.with_extension(ext)
}

/// Writes JSON / markdown / SVG where asked (markdown and SVG default to beside the JSON).
pub fn write_outputs(r: &Report, md: &str, c: &Common) -> Result<(), String> {
    let write = |p: &Path, data: &[u8]| -> Result<(), String> {
        if let Some(d) = p.parent() {
            if !d.as_os_str().is_empty() {
                std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            }
        }
        std::fs::write(p, data).map_err(|e| format!("{}: {e}", p.display()))
    };
    if let Some(j) = &c.json {
        let text = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
        write(j, text.as_bytes())?;
    }
    let md_path =
        c.md.clone()
            .or_else(|| c.json.as_ref().map(|j| sibling(j, "md")));
    if let Some(p) = md_path {
        write(&p, md.as_bytes())?;
    }
    let svg_prefix = c
        .svg
        .clone()
        .or_else(|| c.json.as_ref().map(|j| j.with_extension("")));
    if let Some(p) = svg_prefix {
        let base = p.to_string_lossy().to_string();
        write(
            Path::new(&format!("{base}-throughput.svg")),
            svg_throughput(r).as_bytes(),
        )?;
        write(
            Path::new(&format!("{base}-latency.svg")),
            svg_latency(r).as_bytes(),
        )?;
        write(
            Path::new(&format!("{base}-latency-percentiles.svg")),
            svg_percentiles(r).as_bytes(),
        )?;
    }
    Ok(())
}
