//! The header of a safetensors file: an 8-byte little-endian length, then a JSON object naming
//! each tensor's dtype, shape and byte range in the data that follows. Read to check that a
//! workload's tensor is there with the definition's dtype and the workload's shape before the
//! file is copied into a task.

use std::io::Read;
use std::path::Path;

/// Headers larger than this are not safetensors files written for kernel workloads.
const MAX_HEADER: u64 = 100 << 20;

#[derive(serde::Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<i64>,
    data_offsets: [u64; 2],
}

/// The FlashInfer-Bench dtype name of a safetensors dtype.
fn dtype_name(st: &str) -> Option<&'static str> {
    Some(match st {
        "F32" => "float32",
        "F16" => "float16",
        "BF16" => "bfloat16",
        "I32" => "int32",
        "I64" => "int64",
        _ => return None,
    })
}

/// Checks that `path` holds tensor `key` of FlashInfer-Bench dtype `dtype` and shape `shape`.
pub(crate) fn check(path: &Path, key: &str, dtype: &str, shape: &[i64]) -> Result<(), String> {
    let shown = path.display();
    let mut file = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
    let len = file.metadata().map_err(|e| format!("{shown}: {e}"))?.len();
    let mut size = [0u8; 8];
    file.read_exact(&mut size)
        .map_err(|_| format!("{shown}: not a safetensors file (shorter than its header)"))?;
    let size = u64::from_le_bytes(size);
    if size > MAX_HEADER || 8 + size > len {
        return Err(format!(
            "{shown}: not a safetensors file (header of {size} bytes)"
        ));
    }
    let mut header = vec![0u8; size as usize];
    file.read_exact(&mut header)
        .map_err(|e| format!("{shown}: {e}"))?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| format!("{shown}: not a safetensors header: {e}"))?;
    let entry = header
        .get(key)
        .ok_or_else(|| format!("{shown} has no tensor `{key}`"))?;
    let entry: Entry = serde_json::from_value(entry.clone())
        .map_err(|e| format!("{shown}: tensor `{key}`: {e}"))?;
    match dtype_name(&entry.dtype) {
        Some(d) if d == dtype => {}
        Some(d) => {
            return Err(format!(
                "{shown}: tensor `{key}` is {d}, the definition says {dtype}"
            ))
        }
        None => {
            return Err(format!(
                "{shown}: tensor `{key}` has dtype {}, which the import does not read",
                entry.dtype
            ))
        }
    }
    if entry.shape != shape {
        return Err(format!(
            "{shown}: tensor `{key}` has shape {:?}, the workload's is {shape:?}",
            entry.shape
        ));
    }
    let [start, end] = entry.data_offsets;
    let elem = if matches!(dtype, "float16" | "bfloat16") {
        2
    } else if dtype == "int64" {
        8
    } else {
        4
    };
    let count: i64 = shape.iter().product();
    if end < start || end - start != count as u64 * elem || 8 + size + end > len {
        return Err(format!("{shown}: tensor `{key}`'s byte range {start}..{end} does not fit its shape or the file"));
    }
    Ok(())
}

/// A safetensors file holding `tensors` (name, dtype, shape, little-endian bytes): for tests
/// and examples.
pub fn write(path: &Path, tensors: &[(&str, &str, Vec<i64>, Vec<u8>)]) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape, bytes) in tensors {
        let end = offset + bytes.len() as u64;
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let header = serde_json::Value::Object(header).to_string().into_bytes();
    let mut out = Vec::new();
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    std::fs::write(path, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_checks_and_mismatches_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let data: Vec<u8> = [0i32, 3, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        write(&path, &[("indptr", "I32", vec![3], data)]).unwrap();
        assert_eq!(check(&path, "indptr", "int32", &[3]), Ok(()));
        let e = check(&path, "indptr", "int64", &[3]).unwrap_err();
        assert!(e.contains("is int32, the definition says int64"), "{e}");
        let e = check(&path, "indptr", "int32", &[4]).unwrap_err();
        assert!(e.contains("has shape [3], the workload's is [4]"), "{e}");
        let e = check(&path, "nope", "int32", &[3]).unwrap_err();
        assert!(e.contains("no tensor `nope`"), "{e}");
        std::fs::write(&path, b"short").unwrap();
        assert!(check(&path, "indptr", "int32", &[3])
            .unwrap_err()
            .contains("not a safetensors file"));
    }
}
