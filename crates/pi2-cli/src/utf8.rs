//! Streams token bytes as text without cutting a UTF-8 character in half.

#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Add bytes; returns the text that is complete so far.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // invalid (not just incomplete): emit with replacement characters
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        text
    }

    /// Whatever is left (lossy).
    pub fn finish(&mut self) -> String {
        let t = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_character_waits_for_its_rest() {
        let mut s = Utf8Stream::default();
        let e = "é".as_bytes();
        assert_eq!(s.push(&[b'a', e[0]]), "a");
        assert_eq!(s.push(&e[1..]), "é");
        assert_eq!(s.push(&[0xFF]), "\u{FFFD}");
        assert_eq!(s.finish(), "");
    }
}
