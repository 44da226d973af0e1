//! Generated text as it streams: token bytes to text without cutting a UTF-8 character in
//! half, and stop strings found across token boundaries.

/// Token bytes in, complete UTF-8 text out.
#[derive(Debug, Default)]
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

/// Finds the first of several stop strings in streamed text. Text that could be the start
/// of a stop string is held back until the next piece shows whether it is.
#[derive(Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
    /// The stop string found, once one is.
    matched: Option<String>,
}

impl StopStrings {
    /// Empty stop strings are ignored (they would stop before any text).
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Self::default()
        }
    }

    /// Whether a stop string has been seen (nothing more is released after it).
    pub fn stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that ended the text (the earliest found), if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Adds `piece`; returns the text now known not to belong to a stop string. After a stop
    /// string is found, returns the text before it and then nothing.
    pub fn push(&mut self, piece: &str) -> String {
        if self.matched.is_some() {
            return String::new();
        }
        self.held.push_str(piece);
        let found = (self.stops.iter())
            .filter_map(|s| Some((self.held.find(s.as_str())?, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, s)) = found {
            self.matched = Some(s.clone());
            self.held.truncate(at);
            return std::mem::take(&mut self.held);
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_tail_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        std::mem::replace(&mut self.held, rest)
    }

    /// The text held back when generation ends without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop` (on character
/// boundaries).
fn longest_tail_prefix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && stop.is_char_boundary(n)
                && text.ends_with(&stop[..n])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopStrings::new(stops.iter().map(|s| s.to_string()));
        let mut out: String = pieces.iter().map(|p| s.push(p)).collect();
        out.push_str(&s.finish());
        (out, s.stopped())
    }

    #[test]
    fn stop_strings_are_found_across_pieces_and_cut() {
        assert_eq!(run(&["</s>"], &["a<", "/", "s>b"]), ("a".into(), true));
        assert_eq!(
            run(&["\n\n", "END"], &["x\n", "y", "EN", "D"]),
            ("x\ny".into(), true)
        );
        // A held prefix that turns out not to be a stop string is released.
        assert_eq!(run(&["abc"], &["xab", "d"]), ("xabd".into(), false));
        assert_eq!(run(&["abc"], &["xab"]), ("xab".into(), false));
        assert_eq!(run(&[""], &["text"]), ("text".into(), false));
        assert_eq!(run(&["é!"], &["aé", "é", "!"]), ("aé".into(), true));
    }

    #[test]
    fn text_is_released_as_soon_as_it_cannot_start_a_stop_string() {
        let mut s = StopStrings::new(["STOP".to_string()]);
        assert_eq!(s.push("hello S"), "hello ");
        assert_eq!(s.push("T"), "");
        assert_eq!(s.push("x"), "STx");
    }

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
