//! Opaque page cursors: the hex of a key's bytes, so any key (any name,
//! any id) survives a query string untouched and clients cannot mistake
//! it for something to build themselves.

pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The bytes of an even run of hex digits; `None` for anything else.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_is_not_hex() {
        assert_eq!(encode(b"a/\xff"), "612fff");
        assert_eq!(decode("612fff").as_deref(), Some(&b"a/\xff"[..]));
        assert_eq!(decode("abc"), None);
        assert_eq!(decode("zz"), None);
        assert_eq!(decode("é1"), None);
        assert_eq!(decode(""), Some(Vec::new()));
    }
}
