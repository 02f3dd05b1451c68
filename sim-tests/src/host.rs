//! Which machine a benchmark ran on, for the record.
//!
//! Seeds per minute and wall time are the host's as much as the code's: the
//! same binary, simulating exactly the same runs (same trace fingerprint),
//! has measured 2.2-2.6x apart on two machines of the same advertised size.
//! So every timed result names its CPU; numbers from different CPUs are not
//! comparable.
//!
//! Read outside the simulation only (it opens a file of the real host);
//! nothing read here reaches a simulated run or its trace.

/// "model, N CPUs", e.g. "Intel(R) Xeon(R) Processor, 2 CPUs". Unknown parts
/// say so rather than fail: a report without a CPU name is still a report.
pub fn describe() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| cpu_model(&text).map(str::to_string))
        .unwrap_or_else(|| "unknown CPU".to_string());
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get().to_string())
        .unwrap_or_else(|_| "?".to_string());
    format!("{model}, {cpus} CPUs")
}

/// The first processor's model name in Linux's `/proc/cpuinfo` text
/// (`model name` on x86, `Model` or `CPU part` elsewhere is not tried).
fn cpu_model(cpuinfo: &str) -> Option<&str> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        let value = value.trim();
        (key.trim() == "model name" && !value.is_empty()).then_some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_model_name_is_taken() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\n\
                    model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu\n\n\
                    processor\t: 1\nmodel name\t: Other\n";
        assert_eq!(cpu_model(text), Some("Intel(R) Xeon(R) Processor"));
    }

    #[test]
    fn missing_or_empty_names_give_none() {
        assert_eq!(cpu_model(""), None);
        assert_eq!(cpu_model("processor\t: 0\nmodel name\t:   \n"), None);
        assert_eq!(cpu_model("no colon here\nmodel name"), None);
    }

    #[test]
    fn the_description_names_a_cpu_count() {
        assert!(describe().ends_with(" CPUs"), "{}", describe());
    }
}
