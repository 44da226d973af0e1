//! Any text as a plan file: parsed, or refused with an error naming it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pi2_planner::plan::PlanFile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = PlanFile::from_json(text, "fuzz.json");
});
