//! Plan validation against the host, before anything is written.

use crate::error::{Result, TuneError};
use crate::fs::Fs;
use crate::knob::{Knob, Value};
use crate::plan::{Plan, Setting, PLAN_FORMAT, SETTINGS_MAX};
use corelocal::cpu::CpuSet;
use std::collections::HashSet;

/// A setting together with the file's present contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// The setting.
    pub setting: Setting,
    /// The raw file contents now.
    pub raw: String,
    /// The parsed value now.
    pub value: Value,
}

impl Current {
    /// Whether the file already holds the planned value.
    pub fn matches(&self) -> bool {
        self.value == self.setting.value
    }

    /// The text to write, shaped like the present contents.
    pub fn text_to_write(&self) -> String {
        self.setting.value.render_like(&self.raw)
    }
}

fn missing_target(fs: &dyn Fs, knob: &Knob) -> String {
    let path = knob.path();
    match knob {
        Knob::IrqAffinity { irq } => format!("IRQ {irq} does not exist ({path} missing)"),
        k => match k.nic() {
            Some(nic) if !fs.exists(&format!("sys/class/net/{nic}")) => {
                format!("unknown NIC {nic:?} ({path} missing)")
            }
            _ => format!("{path} does not exist on this host"),
        },
    }
}

fn check_cpus(knob: &Knob, value: &Value, online: &CpuSet) -> Result<()> {
    let Value::Cpus(set) = value else {
        return Ok(());
    };
    let offline = set.difference(online);
    if !offline.is_empty() {
        return Err(TuneError::input(format!(
            "{}: CPU(s) {} not online (online: {})",
            knob.path(),
            offline.to_list(),
            online.to_list()
        )));
    }
    let needs_cpu = matches!(knob, Knob::IrqAffinity { .. } | Knob::XpsCpus { .. });
    if needs_cpu && set.is_empty() {
        return Err(TuneError::input(format!(
            "{}: an empty CPU set would leave the queue with no CPU; refusing",
            knob.path()
        )));
    }
    Ok(())
}

/// Reads and parses a knob's present contents.
pub fn read_current(fs: &dyn Fs, setting: &Setting) -> Result<Current> {
    let path = setting.knob.path();
    if !fs.exists(&path) {
        return Err(TuneError::input(missing_target(fs, &setting.knob)));
    }
    let raw = fs.read(&path).map_err(|e| {
        TuneError::input(format!(
            "cannot read {path}: {e} (single-queue devices have no XPS)"
        ))
    })?;
    let value = Value::parse(setting.knob.kind(), &raw)
        .map_err(|e| TuneError::input(format!("{path}: present contents unreadable: {e}")))?;
    Ok(Current {
        setting: setting.clone(),
        raw,
        value,
    })
}

/// Checks a plan's header and shape (no host access).
pub fn check_shape(plan: &Plan) -> Result<()> {
    if plan.format != PLAN_FORMAT {
        return Err(TuneError::input(format!(
            "plan format {:?} is not {PLAN_FORMAT:?}",
            plan.format
        )));
    }
    if plan.settings.len() > SETTINGS_MAX {
        return Err(TuneError::input(format!(
            "plan has more than {SETTINGS_MAX} settings"
        )));
    }
    let mut seen = HashSet::new();
    for s in &plan.settings {
        if !seen.insert(&s.knob) {
            return Err(TuneError::input(format!(
                "{} appears twice in the plan",
                s.knob.path()
            )));
        }
    }
    Ok(())
}

/// Validates a plan against the host and reads every knob's present value. Any problem is an
/// input error and nothing has been written.
pub fn check_plan(fs: &dyn Fs, online: &CpuSet, plan: &Plan) -> Result<Vec<Current>> {
    check_shape(plan)?;
    let mut out = Vec::with_capacity(plan.settings.len());
    for s in &plan.settings {
        check_cpus(&s.knob, &s.value, online)?;
        let cur = read_current(fs, s)?;
        if !cur.matches() && !fs.writable(&s.knob.path()).unwrap_or(false) {
            return Err(TuneError::input(format!(
                "{} is read-only (a managed IRQ, or not permitted); nothing was changed",
                s.knob.path()
            )));
        }
        out.push(cur);
    }
    Ok(out)
}
