//! The bucket workload of the scale bench: S3-like object keys with
//! seven meta fields, added by path in batches. Even objects go into one flat directory
//! (`bucket/flat`) under scrambled names, as uploads with random keys
//! land; odd ones spread over 10,000 prefixes (`bucket/p0000` ..
//! `bucket/p9999`), each named after its number, so every prefix grows
//! at its end.

/// Prefixes the odd objects spread over.
pub const PREFIXES: u64 = 10_000;

/// The path attribute.
pub const FILE_NAME: &str = "FileName";

/// The flat directory every even object lands in.
pub fn flat_dirs() -> Vec<String> {
    vec!["bucket".into(), "flat".into()]
}

/// A bijective scramble of `i`: distinct objects get distinct names, in
/// an order unrelated to their creation.
fn scrambled(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) ^ 0x5bd1_e995
}

/// The directories and the name of object `i`.
pub fn key(i: u64) -> (Vec<String>, String) {
    if i.is_multiple_of(2) {
        (flat_dirs(), format!("upload-{:016x}.bin", scrambled(i)))
    } else {
        let half = i / 2;
        let dirs = vec!["bucket".into(), format!("p{:04}", half % PREFIXES)];
        (dirs, format!("object-{:012}.bin", half / PREFIXES))
    }
}

/// The seven fields of object `i` named `name`, FileName first: about
/// 300 bytes, as an S3 object version carries.
pub fn fields(i: u64, name: String) -> Vec<(&'static str, String)> {
    vec![
        (FILE_NAME, name),
        (
            "OID",
            format!("{:064x}", scrambled(i) as u128 * 0x1_0000_0001),
        ),
        ("Owner", "NbUgTSFvPmsRxmGeWpuuGeJUoRoi6PErcM".into()),
        ("Size", (i * 4096 % 1_000_000_007).to_string()),
        ("Created", (1_700_000_000 + i).to_string()),
        ("ContentType", "application/octet-stream".into()),
        ("ETag", format!("{:032x}", scrambled(i ^ 0xe7a6))),
    ]
}

/// The bytes an op of these fields takes encoded as the log keeps it
/// and a pull carries it: parent and child ids (8 each), an item count
/// (4), each item's key and value with a 4-byte length each, and the
/// op's timestamp (8).
pub fn encoded_op_bytes<'a>(fields: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> u64 {
    let items: usize = fields.into_iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
    (8 + 8 + 4 + items + 8) as u64
}
