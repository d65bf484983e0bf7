//! The read-only file maps a model's bytes live in ([`map_file`](crate::onnx::map_file)), and giving
//! back to the operating system the pages of a weight that a kernel has copied into a form of
//! its own (a MatMul's packed panels, as ONNX Runtime's prepacking frees the initializer it
//! packed): the run then holds the weight once, not twice.
//!
//! Giving back a page only unmaps it from this process: the page cache keeps the file, and
//! any later read of the weight (another consumer of it, an export) faults the same bytes back
//! in. That is what makes it safe: the maps are read-only and private, never written, so a
//! page read again always holds the file's bytes. Pages of anything else (heap memory, where
//! giving a page back would zero it) are never touched: only ranges inside a registered map.

use std::sync::Mutex;

/// The address ranges (start, length) of the live maps.
static MAPS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

fn maps() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    // A poisoned lock only means a panic elsewhere: the list is never left half-written.
    MAPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A read-only map of a whole file, registered while it lives.
pub(crate) struct MappedFile(memmap2::Mmap);

impl MappedFile {
    pub(crate) fn new(map: memmap2::Mmap) -> MappedFile {
        maps().push((map.as_ptr() as usize, map.len()));
        MappedFile(map)
    }
}

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        let entry = (self.0.as_ptr() as usize, self.0.len());
        let mut maps = maps();
        if let Some(i) = maps.iter().position(|&m| m == entry) {
            maps.swap_remove(i);
        }
    }
}

/// Whether all of `bytes` lies inside one file map.
pub fn is_mapped(bytes: &[u8]) -> bool {
    let (start, end) = (
        bytes.as_ptr() as usize,
        bytes.as_ptr() as usize + bytes.len(),
    );
    !bytes.is_empty() && maps().iter().any(|&(s, len)| s <= start && end <= s + len)
}

/// Unmaps the whole pages inside `bytes` from this process where `bytes` lies in a file map
/// (the partial pages at either end may hold other tensors' bytes and stay). Returns the
/// number of bytes given back: 0 where `bytes` is not mapped from a file or spans no whole
/// page.
pub fn release_pages(bytes: &[u8]) -> usize {
    #[cfg(unix)]
    {
        // Held across the call, so that no map is dropped while its pages are given back
        // (the caller's borrow of `bytes` keeps it alive anyway).
        let maps = maps();
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        if bytes.is_empty() || !maps.iter().any(|&(s, len)| s <= start && end <= s + len) {
            return 0;
        }
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .unwrap_or(4096)
            .max(1);
        let (first, last) = (start.next_multiple_of(page), end / page * page);
        if first >= last {
            return 0;
        }
        // SAFETY: the range lies inside a live read-only private file map (checked above under
        // the lock that its owner's drop takes); MADV_DONTNEED on such a map only drops the
        // pages from this process's page tables, and a later read faults the file's unchanged
        // bytes back in, so no reference into it sees different values.
        let rc = unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_DONTNEED,
            )
        };
        if rc == 0 {
            last - first
        } else {
            0
        }
    }
    #[cfg(not(unix))]
    {
        let _ = bytes;
        0
    }
}

#[cfg(all(test, target_os = "linux"))]
/// The resident bytes (`Rss` in /proc/self/smaps) of this process's mapping that starts
/// at `start`.
pub(crate) fn mapping_rss(start: usize) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut lines = smaps.lines();
    while let Some(line) = lines.next() {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((s, _)) = range.split_once('-') {
            if usize::from_str_radix(s, 16) == Ok(start) {
                for l in lines.by_ref() {
                    if let Some(kb) = l.strip_prefix("Rss:") {
                        let kb = kb.trim().trim_end_matches("kB").trim();
                        return kb.parse::<usize>().unwrap() * 1024;
                    }
                }
            }
        }
    }
    panic!("no mapping at {start:#x}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_mapped_files_pages_are_given_back_and_read_again_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        let values: Vec<u8> = (0..64 * 4096u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &values).unwrap();
        let bytes = crate::onnx::map_file(&path).unwrap();
        let start = bytes.as_ptr() as usize;
        let inner = &bytes[100..bytes.len() - 100];
        assert!(is_mapped(inner));
        // Every page read: all of them resident in this process.
        assert_eq!(inner, &values[100..values.len() - 100]);
        assert_eq!(mapping_rss(start), bytes.len());
        // All but the two partial pages given back, then read again unchanged.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        assert_eq!(release_pages(inner), bytes.len() - 2 * page);
        assert_eq!(mapping_rss(start), 2 * page);
        assert_eq!(inner, &values[100..values.len() - 100]);
        assert_eq!(mapping_rss(start), bytes.len());
        // Heap memory is never touched.
        let heap = values.clone();
        assert!(!is_mapped(&heap));
        assert_eq!(release_pages(&heap), 0);
        assert_eq!(heap, values);
        drop(bytes);
        assert!(!maps().iter().any(|&(s, _)| s == start));
    }
}
