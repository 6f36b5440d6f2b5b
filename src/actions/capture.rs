//! Bounded capture of text a handler did not write itself (HTTP bodies,
//! stdout, stderr): whatever the other side sends, memory and the stored
//! output stay within [`OUTPUT_CAP_BYTES`](super::OUTPUT_CAP_BYTES).

use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes kept up to a cap, remembering whether anything was dropped.
#[derive(Debug, Default)]
pub(crate) struct Captured {
    cap: usize,
    bytes: Vec<u8>,
    truncated: bool,
}

impl Captured {
    pub(crate) fn new(cap: usize) -> Captured {
        Captured {
            cap,
            bytes: Vec::new(),
            truncated: false,
        }
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        let room = self.cap.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        self.bytes
            .extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    pub(crate) fn is_full(&self) -> bool {
        self.bytes.len() >= self.cap
    }

    pub(crate) fn mark_truncated(&mut self) {
        self.truncated = true;
    }

    /// The text (invalid UTF-8 replaced) and whether it was cut.
    pub(crate) fn into_text(self) -> (String, bool) {
        let (text, cut) = utf8_prefix(&self.bytes, self.cap);
        (text, self.truncated || cut)
    }
}

/// Reads `pipe` to its end into `into`. Past the cap it keeps reading and
/// discarding, because a child blocked on a full pipe would never exit. Read
/// errors end the capture: the exit status, not the pipe, decides the result.
pub(crate) async fn drain_into<R: AsyncRead + Unpin>(mut pipe: R, into: &mut Captured) {
    let mut buf = vec![0u8; 8 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => into.push(&buf[..n]),
        }
    }
}

/// At most `cap` bytes of `bytes` as text, never splitting a UTF-8 sequence
/// at the cut (a dangling half character would become U+FFFD and could push
/// the text past the cap). Returns whether anything was cut.
pub(crate) fn utf8_prefix(bytes: &[u8], cap: usize) -> (String, bool) {
    let mut end = bytes.len().min(cap);
    let cut = end < bytes.len();
    if cut {
        // A UTF-8 sequence is at most 4 bytes: back off over continuation
        // bytes (10xxxxxx) to the start of the character that was split.
        let mut back = end;
        while back > 0 && end - back < 4 && (bytes[back - 1] & 0xC0) == 0x80 {
            back -= 1;
        }
        if back > 0 && std::str::from_utf8(&bytes[back - 1..end]).is_err() {
            end = back - 1;
        }
    }
    (String::from_utf8_lossy(&bytes[..end]).into_owned(), cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_up_to_the_cap_and_flags_the_rest() {
        let mut c = Captured::new(5);
        c.push(b"abc");
        assert!(!c.is_full());
        c.push(b"defg");
        assert!(c.is_full());
        assert_eq!(c.into_text(), ("abcde".to_string(), true));

        let mut exact = Captured::new(3);
        exact.push(b"abc");
        assert_eq!(exact.into_text(), ("abc".to_string(), false));
    }

    #[test]
    fn never_splits_a_character() {
        let text = "aé€😀".as_bytes(); // 1 + 2 + 3 + 4 bytes
        assert_eq!(utf8_prefix(text, 2), ("a".to_string(), true));
        assert_eq!(utf8_prefix(text, 3), ("aé".to_string(), true));
        assert_eq!(utf8_prefix(text, 5), ("aé".to_string(), true));
        assert_eq!(utf8_prefix(text, 6), ("aé€".to_string(), true));
        assert_eq!(utf8_prefix(text, 9), ("aé€".to_string(), true));
        assert_eq!(utf8_prefix(text, 10), ("aé€😀".to_string(), false));
        // Binary data is shown lossily rather than refused.
        assert_eq!(
            utf8_prefix(&[0xff, b'a'], 10),
            ("\u{fffd}a".to_string(), false)
        );
    }

    #[tokio::test]
    async fn drains_past_the_cap() {
        let data = vec![b'x'; 100_000];
        let mut c = Captured::new(10);
        drain_into(&data[..], &mut c).await;
        assert_eq!(c.into_text(), ("x".repeat(10), true));
    }
}
