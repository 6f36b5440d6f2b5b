//! Error messages in the caller's language (seed 001's i18n): one catalogue
//! per locale in `locale/*.toml`, embedded in the binary, chosen by
//! `Accept-Language`. Only messages change with the locale; error codes
//! and field names never do.
//!
//! The catalogues use a small subset of TOML (`key = "text"`, `[section]`,
//! `#` comments, `\"` `\\` `\n` `\t` escapes), read by [`parse`] rather than
//! a TOML dependency.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::http::HeaderMap;
use axum::http::header::ACCEPT_LANGUAGE;

/// The locales with a catalogue, the default first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locale {
    En,
    Ar,
}

impl Locale {
    pub const ALL: [Locale; 2] = [Locale::En, Locale::Ar];

    pub fn tag(self) -> &'static str {
        match self {
            Locale::En => "en",
            Locale::Ar => "ar",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Locale::En => include_str!("../../locale/en.toml"),
            Locale::Ar => include_str!("../../locale/ar.toml"),
        }
    }

    fn catalogue(self) -> &'static Catalogue {
        static CATALOGUES: LazyLock<Vec<Catalogue>> = LazyLock::new(|| {
            // The files are embedded and checked by the tests below, so a
            // parse error cannot ship; should one, messages fall back to
            // the error's own English text rather than failing a request.
            Locale::ALL
                .iter()
                .map(|l| parse(l.source()).unwrap_or_default())
                .collect()
        });
        &CATALOGUES[self as usize]
    }

    /// The best supported locale of an `Accept-Language` header (RFC 9110
    /// §12.5.4): highest q first, earlier on ties, `ar-SA` matches `ar`,
    /// `q=0` refuses; English when nothing matches.
    pub fn negotiate(headers: &HeaderMap) -> Locale {
        let mut best: Option<(Locale, f32)> = None;
        for value in headers.get_all(ACCEPT_LANGUAGE) {
            let Ok(value) = value.to_str() else { continue };
            for range in value.split(',') {
                let mut parts = range.split(';');
                let tag = parts.next().unwrap_or("").trim();
                let mut q = 1.0f32;
                for param in parts {
                    if let Some((k, v)) = param.split_once('=')
                        && k.trim().eq_ignore_ascii_case("q")
                    {
                        q = v.trim().parse().unwrap_or(0.0);
                    }
                }
                let primary = tag.split('-').next().unwrap_or("");
                let locale = if primary == "*" {
                    Some(Locale::En)
                } else {
                    Locale::ALL
                        .into_iter()
                        .find(|l| l.tag().eq_ignore_ascii_case(primary))
                };
                if let Some(locale) = locale
                    && q > 0.0
                    && best.is_none_or(|(_, best_q)| q > best_q)
                {
                    best = Some((locale, q));
                }
            }
        }
        best.map_or(Locale::En, |(locale, _)| locale)
    }
}

/// A catalogue's entries: `key` or `section.key` to text.
pub type Catalogue = HashMap<String, String>;

/// A message to be shown in some locale: its catalogue key and the values
/// of its placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub key: &'static str,
    pub args: Vec<(&'static str, String)>,
}

impl Message {
    pub fn new(key: &'static str) -> Message {
        Message {
            key,
            args: Vec::new(),
        }
    }

    pub fn arg(mut self, name: &'static str, value: impl Into<String>) -> Message {
        self.args.push((name, value.into()));
        self
    }

    /// The text in `locale`, or None when its catalogue lacks the key.
    pub fn render(&self, locale: Locale) -> Option<String> {
        let template = locale.catalogue().get(self.key)?;
        let mut out = template.clone();
        for (name, value) in &self.args {
            let value = match *name {
                // Recurring phrases and object names are translated when
                // the English catalogue knows them; anything else (a
                // field name, an id, a cron parser's explanation) stays.
                "detail" => translate_phrase("detail", value, locale),
                "what" => translate_phrase("what", value, locale),
                _ => value.clone(),
            };
            out = out.replace(&format!("{{{name}}}"), &value);
        }
        Some(out)
    }
}

/// `text`, an English entry of `section`, in `locale`; unchanged when it is
/// not an entry.
fn translate_phrase(section: &str, text: &str, locale: Locale) -> String {
    if locale == Locale::En {
        return text.to_string();
    }
    let prefix = format!("{section}.");
    Locale::En
        .catalogue()
        .iter()
        .find(|(key, english)| key.starts_with(&prefix) && english.as_str() == text)
        .and_then(|(key, _)| locale.catalogue().get(key))
        .cloned()
        .unwrap_or_else(|| text.to_string())
}

/// The English text of `section.key` (for building details that the other
/// catalogues can then translate).
pub fn english(key: &str) -> String {
    Locale::En
        .catalogue()
        .get(key)
        .cloned()
        .unwrap_or_else(|| key.to_string())
}

/// Reads a catalogue. Errors name the line.
pub fn parse(source: &str) -> Result<Catalogue, String> {
    let mut entries = Catalogue::new();
    let mut section = String::new();
    for (index, raw) in source.lines().enumerate() {
        let line_no = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| format!("line {line_no}: expected key = \"text\""))?;
        let key = key.trim();
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!("line {line_no}: bad key {key:?}"));
        }
        let text = unquote(value.trim()).map_err(|e| format!("line {line_no}: {e}"))?;
        let key = if section.is_empty() {
            key.to_string()
        } else {
            format!("{section}.{key}")
        };
        if entries.insert(key.clone(), text).is_some() {
            return Err(format!("line {line_no}: {key} is defined twice"));
        }
    }
    Ok(entries)
}

/// A TOML basic string (`"…"`, then optionally a comment) to its text.
fn unquote(value: &str) -> Result<String, String> {
    let mut chars = value
        .strip_prefix('"')
        .ok_or("the text must be in double quotes")?
        .chars();
    let mut out = String::new();
    loop {
        match chars.next() {
            None => return Err("unterminated string".into()),
            Some('"') => break,
            Some('\\') => match chars.next() {
                Some('"') => out.push('"'),
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                other => return Err(format!("unsupported escape \\{}", other.unwrap_or(' '))),
            },
            Some(c) => out.push(c),
        }
    }
    let rest = chars.as_str().trim();
    if !rest.is_empty() && !rest.starts_with('#') {
        return Err(format!("unexpected {rest:?} after the text"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn placeholders(text: &str) -> Vec<String> {
        let mut names: Vec<String> = text
            .split('{')
            .skip(1)
            .filter_map(|part| part.split_once('}').map(|(name, _)| name.to_string()))
            .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_catalogue_parses_with_the_same_keys_and_placeholders() {
        let en = parse(Locale::En.source()).unwrap();
        assert!(en.len() > 20);
        for locale in Locale::ALL {
            let other = parse(locale.source()).unwrap();
            let mut missing: Vec<_> = en.keys().filter(|k| !other.contains_key(*k)).collect();
            missing.extend(other.keys().filter(|k| !en.contains_key(*k)));
            assert!(missing.is_empty(), "{}: {missing:?}", locale.tag());
            for (key, text) in &en {
                assert_eq!(
                    placeholders(text),
                    placeholders(&other[key]),
                    "{}: {key}",
                    locale.tag()
                );
            }
        }
    }

    #[test]
    fn the_parser_reads_sections_escapes_and_comments_and_names_bad_lines() {
        let c = parse("# c\na = \"x \\\"y\\\" \\\\u0000\" # note\n[s]\nb = \"z\"\n").unwrap();
        assert_eq!(c["a"], "x \"y\" \\u0000");
        assert_eq!(c["s.b"], "z");
        assert!(parse("a = x").unwrap_err().contains("line 1"));
        assert!(parse("\na = \"x").unwrap_err().contains("line 2"));
        assert!(parse("a = \"x\"\na = \"y\"").unwrap_err().contains("twice"));
    }

    fn with_language(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT_LANGUAGE, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn accept_language_is_negotiated_with_q_values() {
        assert_eq!(Locale::negotiate(&HeaderMap::new()), Locale::En);
        for (header, expected) in [
            ("ar", Locale::Ar),
            ("AR-sa", Locale::Ar),
            ("fr, ar;q=0.5", Locale::Ar),
            ("en;q=0.4, ar;q=0.9", Locale::Ar),
            ("ar;q=0.4, en;q=0.9", Locale::En),
            ("ar;q=0, *", Locale::En),
            ("ar;q=0", Locale::En),
            ("de, fr", Locale::En),
            ("en, ar", Locale::En),
            ("ar;q=bad", Locale::En),
        ] {
            assert_eq!(
                Locale::negotiate(&with_language(header)),
                expected,
                "{header}"
            );
        }
    }

    #[test]
    fn known_phrases_are_translated_and_field_names_kept() {
        let message = Message::new("invalid_field")
            .arg("field", "name")
            .arg("detail", english("detail.required"));
        assert_eq!(message.render(Locale::En).unwrap(), "name: is required");
        let arabic = message.render(Locale::Ar).unwrap();
        assert!(
            arabic.contains("name") && arabic.contains("مطلوب"),
            "{arabic}"
        );
        let unknown = Message::new("invalid_field")
            .arg("field", "cron_expression")
            .arg("detail", "61 is out of range");
        assert!(
            unknown
                .render(Locale::Ar)
                .unwrap()
                .contains("61 is out of range")
        );
        let not_found = Message::new("not_found")
            .arg("what", "branch rule")
            .arg("id", "x");
        assert_eq!(
            not_found.render(Locale::Ar).unwrap(),
            "لم يُعثر على قاعدة الفرع x"
        );
    }
}
