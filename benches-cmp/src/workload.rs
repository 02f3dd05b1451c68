//! The workload every side runs: object versions added by path, the shape
//! of `engine/benches/engine.rs`'s `add_by_path` scenario. Object `i` lives
//! under 2-3 directories shared with many others and carries seven meta
//! fields, FileName first.

/// Name of the path attribute (pilorama's internal attribute too).
pub const FILE_NAME: &str = "FileName";

/// One AddByPath call: the directory names and the leaf's fields.
pub struct Object {
    pub dirs: Vec<String>,
    pub meta: Vec<(String, String)>,
}

/// 8 buckets x 64 prefixes, every other object one level deeper.
fn dirs(i: usize) -> Vec<String> {
    let mut dirs = vec![
        format!("bucket-{}", i % 8),
        format!("prefix-{}", (i / 8) % 64),
    ];
    if i % 2 == 1 {
        dirs.push(format!("sub-{}", (i / 512) % 32));
    }
    dirs
}

/// About 300 bytes of fields, as an S3 object version carries.
fn meta(i: usize) -> Vec<(String, String)> {
    let field = |k: &str, v: String| (k.to_string(), v);
    vec![
        field(FILE_NAME, format!("object-{i:08}.bin")),
        field(
            "OID",
            format!("{:064x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        ),
        field("Owner", "NbUgTSFvPmsRxmGeWpuuGeJUoRoi6PErcM".into()),
        field("Size", (i * 4096).to_string()),
        field("Created", (1_700_000_000 + i).to_string()),
        field("ContentType", "application/octet-stream".into()),
        field("ETag", format!("{:032x}", i.wrapping_mul(31))),
    ]
}

pub fn objects(count: usize) -> Vec<Object> {
    (0..count)
        .map(|i| Object {
            dirs: dirs(i),
            meta: meta(i),
        })
        .collect()
}
