//! The value types of the API's contract: each one checks itself when a
//! request is read (so a bad value is a 400 naming its field, from serde's
//! path) and describes itself to the OpenAPI document with the same rule,
//! so the document says exactly what the server accepts.

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::{KnownFormat, Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::clock::millis_to_utc;
use crate::schedule::{CronSchedule, TimeOfDay, parse_timezone};

/// The longest name the catalog keeps, in characters.
pub const NAME_MAX_CHARS: usize = 200;

fn string_schema() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

/// A time the database keeps in epoch milliseconds, shown as RFC 3339.
///
/// Read from stored rows (milliseconds); written to clients as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(pub i64);

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&millis_to_utc(self.0).to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        i64::deserialize(deserializer).map(Timestamp)
    }
}

impl PartialSchema for Timestamp {
    fn schema() -> RefOr<Schema> {
        string_schema()
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .examples(["2026-03-29T01:30:00+00:00"])
            .into()
    }
}

impl ToSchema for Timestamp {}

/// An RFC 3339 time a client sends, from 1970 to 9999 (before that a next
/// run is nonsense and would put millennia into the dispatch lag
/// histogram; after it RFC 3339 has no four-digit year), kept as epoch ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTime(pub i64);

impl RequestTime {
    /// On the first day of 1970 and the last of 9999 the offset may not
    /// point outside the range (`+hh:mm` on the first, `-hh:mm` on the
    /// last), which keeps the rule one a pattern can state exactly.
    pub fn parse(text: &str) -> Result<RequestTime, String> {
        use chrono::Datelike;
        let time = chrono::DateTime::parse_from_rfc3339(text)
            .map_err(|e| format!("{text:?} is not an RFC 3339 time: {e}"))?;
        let ms = time.timestamp_millis();
        let local = time.naive_local().date();
        let offset = time.offset().local_minus_utc();
        let edge =
            |year, month, day| (local.year(), local.month(), local.day()) == (year, month, day);
        let inside = (EARLIEST_TIME_MS..=LATEST_TIME_MS).contains(&ms)
            && !(edge(1970, 1, 1) && offset > 0)
            && !(edge(9999, 12, 31) && offset < 0);
        if inside {
            Ok(RequestTime(ms))
        } else {
            Err(
                "must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z \
                 (on those two days, in UTC or an offset towards the range)"
                    .into(),
            )
        }
    }
}

pub use crate::model::{EARLIEST_TIME_MS, LATEST_TIME_MS};

/// [`RequestTime`]'s pattern: an RFC 3339 time whose instant lies within
/// 1970–9999 UTC. Inside the years 1971–9998 any offset will do; on the
/// first day of 1970 only offsets that cannot move it before the epoch, on
/// the last day of 9999 only those that cannot move it past the end.
fn request_time_pattern() -> String {
    const TIME: &str = r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?";
    const ANY: &str = r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    const NOT_EARLIER: &str = r"(Z|[+-]00:00|-([01][0-9]|2[0-3]):[0-5][0-9])";
    const NOT_LATER: &str = r"(Z|[+-]00:00|\+([01][0-9]|2[0-3]):[0-5][0-9])";
    const MONTH: &str = "(0[1-9]|1[0-2])";
    const DAY: &str = "(0[1-9]|[12][0-9]|3[01])";
    const MIDDLE_YEARS: &str =
        "(197[1-9]|19[89][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])";
    let dates = [
        (format!("{MIDDLE_YEARS}-{MONTH}-{DAY}"), ANY),
        (format!("1970-(0[2-9]|1[0-2])-{DAY}"), ANY),
        ("1970-01-(0[2-9]|[12][0-9]|3[01])".to_string(), ANY),
        ("1970-01-01".to_string(), NOT_EARLIER),
        (format!("9999-(0[1-9]|1[01])-{DAY}"), ANY),
        ("9999-12-(0[1-9]|[12][0-9]|30)".to_string(), ANY),
        ("9999-12-31".to_string(), NOT_LATER),
    ];
    let alternatives: Vec<String> = dates
        .iter()
        .map(|(date, offset)| format!("{date}{TIME}{offset}"))
        .collect();
    format!("^({})$", alternatives.join("|"))
}

impl<'de> Deserialize<'de> for RequestTime {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        RequestTime::parse(&text).map_err(D::Error::custom)
    }
}

impl Serialize for RequestTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Timestamp(self.0).serialize(serializer)
    }
}

impl PartialSchema for RequestTime {
    fn schema() -> RefOr<Schema> {
        // `date-time` is RFC 3339's; the pattern adds the range 1970 to
        // 9999 (a year 0 would put millennia into the lag histogram).
        string_schema()
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .pattern(Some(request_time_pattern()))
            .description(Some("RFC 3339, from 1970 to 9999"))
            .examples(["2026-03-29T01:30:00Z"])
            .into()
    }
}

impl ToSchema for RequestTime {}

/// A share from 0 to 1, both included (a simulation's `fail_rate`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
#[serde(transparent)]
pub struct Share(pub f64);

impl Share {
    pub fn check(value: f64) -> Result<Share, String> {
        if (0.0..=1.0).contains(&value) {
            Ok(Share(value))
        } else {
            Err(format!("{value} is not a number from 0 to 1"))
        }
    }
}

impl<'de> Deserialize<'de> for Share {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = f64::deserialize(deserializer)?;
        Share::check(value).map_err(D::Error::custom)
    }
}

impl PartialSchema for Share {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Number)
            .minimum(Some(0.0))
            .maximum(Some(1.0))
            .examples([0.1])
            .into()
    }
}

impl ToSchema for Share {}

/// A name: not blank, no NUL, at most [`NAME_MAX_CHARS`] characters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Name(pub String);

impl Name {
    pub fn check(text: &str) -> Result<(), String> {
        if text.chars().all(is_pattern_space) {
            return Err("must not be empty".into());
        }
        if text.chars().count() > NAME_MAX_CHARS {
            return Err(format!("must be at most {NAME_MAX_CHARS} characters"));
        }
        Ok(())
    }
}

/// White space as the schema's pattern (`\s`, JSON Schema's ECMA-262
/// regex) reads it, so the check refuses exactly what the schema does.
/// Rust's `char::is_whitespace` differs: it counts U+0085 and not U+FEFF.
fn is_pattern_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202f}'
                | '\u{205f}'
                | '\u{3000}'
                | '\u{feff}'
    )
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Name::check(&text).map_err(D::Error::custom)?;
        Ok(Name(text))
    }
}

impl PartialSchema for Name {
    fn schema() -> RefOr<Schema> {
        string_schema()
            .min_length(Some(1))
            .max_length(Some(NAME_MAX_CHARS))
            // Some character that is not white space, and no NUL.
            .pattern(Some(r"^[^\u0000]*[^\s\u0000][^\u0000]*$"))
            .examples(["Riyadh night shift"])
            .into()
    }
}

impl ToSchema for Name {}

/// A cron expression: five fields (minute hour day-of-month month
/// day-of-week) or an alias such as `@daily`, that fires at least once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct CronText(pub String);

impl<'de> Deserialize<'de> for CronText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        CronSchedule::parse(&text).map_err(|e| D::Error::custom(e.to_string()))?;
        Ok(CronText(text))
    }
}

/// The format name the document gives cron expressions; a fuzzer is told
/// how to make them (tests/schemathesis_hooks.py), a client reads the
/// description.
pub const CRON_FORMAT: &str = "cron";

impl PartialSchema for CronText {
    fn schema() -> RefOr<Schema> {
        string_schema()
            .format(Some(SchemaFormat::Custom(CRON_FORMAT.into())))
            .min_length(Some(1))
            .description(Some(
                "Five fields, minute hour day-of-month month day-of-week: numbers, names \
                 (JAN, MON), `*`, ranges `a-b` (not backwards), steps `*/n` or `a-b/n` (n ≥ 1), \
                 lists; or @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly. \
                 It must fire at least once (`0 0 30 2 *` never does). Evaluated in the \
                 branch's zone.",
            ))
            .examples(["0 9 * * 1-5", "*/15 * * * *", "@daily"])
            .into()
    }
}

impl ToSchema for CronText {}

/// An IANA time zone name, exactly (no white space around it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ZoneName(pub String);

impl ZoneName {
    pub fn check(zone: &str) -> Result<chrono_tz::Tz, String> {
        let trimmed = zone.trim();
        if trimmed != zone {
            return Err(format!(
                "{zone:?} has white space around it; send {trimmed:?}"
            ));
        }
        parse_timezone(zone).map_err(|e| e.to_string())
    }
}

impl<'de> Deserialize<'de> for ZoneName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        ZoneName::check(&text).map_err(D::Error::custom)?;
        Ok(ZoneName(text))
    }
}

impl PartialSchema for ZoneName {
    fn schema() -> RefOr<Schema> {
        let mut names: Vec<&str> = chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name()).collect();
        names.sort_unstable();
        string_schema()
            .enum_values(Some(names))
            .description(Some("An IANA time zone name"))
            .examples(["Asia/Riyadh"])
            .into()
    }
}

impl ToSchema for ZoneName {}

/// A time of day, `HH:MM` on the 24-hour clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct TimeOfDayText(pub String);

impl<'de> Deserialize<'de> for TimeOfDayText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse::<TimeOfDay>()
            .map_err(|e| D::Error::custom(format!("{text:?} is not HH:MM: {e}")))?;
        Ok(TimeOfDayText(text))
    }
}

impl PartialSchema for TimeOfDayText {
    fn schema() -> RefOr<Schema> {
        string_schema()
            .pattern(Some("^([01][0-9]|2[0-3]):[0-5][0-9]$"))
            .examples(["22:00"])
            .into()
    }
}

impl ToSchema for TimeOfDayText {}

/// Any JSON value the stores keep faithfully: a number without a
/// fraction must fit in 64 bits (a larger one would come back as a lossy
/// float). The values of settings, config and params.
pub struct JsonValue;

/// [`JsonValue`]'s schema. JSON Schema counts 2.0 and 1e300 as integers,
/// so the non-integers are `number` but `not` `integer`, which utoipa's
/// builders cannot say: the document takes this as written.
pub fn json_value_schema() -> serde_json::Value {
    let any = serde_json::json!({ "$ref": "#/components/schemas/JsonValue" });
    serde_json::json!({
        "description": "Any JSON value; a number without a fraction must fit in 64 bits",
        "anyOf": [
            { "type": "null" },
            { "type": "boolean" },
            { "type": "string" },
            { "type": "integer", "minimum": i64::MIN, "maximum": i64::MAX },
            { "type": "number", "not": { "type": "integer" } },
            { "type": "array", "items": any },
            { "type": "object", "additionalProperties": any },
        ]
    })
}

impl PartialSchema for JsonValue {
    fn schema() -> RefOr<Schema> {
        // Replaced by [`json_value_schema`] in the served document.
        ObjectBuilder::new().into()
    }
}

impl ToSchema for JsonValue {}

/// A JSON object of the caller's own keys (brand and rule settings).
pub struct JsonObject;

impl PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        json_object().into()
    }
}

impl ToSchema for JsonObject {}

/// An object whose values are [`JsonValue`]s.
pub fn json_object() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(Ref::from_schema_name("JsonValue")))
}

/// A struct read only from a JSON object. serde also reads a struct from
/// an array of its fields in order, so `[]` would pass for a struct whose
/// fields are all optional (a `policy`), though the document says object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(MapOnly(deserializer)).map(ObjectOnly)
    }
}

/// A deserializer that reads a struct as a map only; everything else as
/// the one it wraps. The wrapped one's visitor (serde_path_to_error's)
/// still sees every key, so an error names the field inside.
struct MapOnly<D>(D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for MapOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every error's body: `{"error": {"code", "message"}}`, the message in the
/// caller's language (`Accept-Language`: en, ar), the code stable.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// Stable across languages and releases.
    #[schema(examples("invalid_field"))]
    pub code: ErrorCode,
    #[schema(examples("name: must not be empty"))]
    pub message: String,
}

/// The `code` of an error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidField,
    InvalidBody,
    InvalidPath,
    InvalidQuery,
    InvalidRequest,
    BodyTooLarge,
    UnsupportedMediaType,
    NotFound,
    Archived,
    NoRoute,
    MethodNotAllowed,
    Conflict,
    Unauthorized,
    ReadOnly,
    Unavailable,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidField => "invalid_field",
            ErrorCode::InvalidBody => "invalid_body",
            ErrorCode::InvalidPath => "invalid_path",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Archived => "archived",
            ErrorCode::NoRoute => "no_route",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::ReadOnly => "read_only",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blank as the schema's pattern reads it: Schemathesis sent a name of
    /// U+0085 alone, which the pattern allows and `str::trim` removed.
    #[test]
    fn a_name_is_blank_exactly_when_the_pattern_says_so() {
        for blank in ["", " ", "\t\n", "\u{3000}", "\u{feff}", "\u{2028} "] {
            assert!(Name::check(blank).is_err(), "{blank:?}");
        }
        for name in ["\u{85}", "a", " x ", "\u{200b}"] {
            assert_eq!(Name::check(name), Ok(()), "{name:?}");
        }
    }

    fn read<T: for<'de> Deserialize<'de>>(json: &str) -> Result<T, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn values_check_themselves_when_read() {
        assert!(read::<Name>(r#""ok""#).is_ok());
        assert!(read::<Name>(r#""  ""#).unwrap_err().contains("empty"));
        assert!(read::<Name>(&format!("\"{}\"", "x".repeat(201))).is_err());
        assert!(read::<CronText>(r#""0 9 * * 1-5""#).is_ok());
        assert!(read::<CronText>(r#""*/0 * * * *""#).is_err());
        assert!(read::<ZoneName>(r#""Asia/Riyadh""#).is_ok());
        assert!(read::<ZoneName>(r#"" Asia/Riyadh""#).is_err());
        assert!(read::<ZoneName>(r#""Mars/Olympus""#).is_err());
        assert!(read::<TimeOfDayText>(r#""22:00""#).is_ok());
        assert!(read::<TimeOfDayText>(r#""+9:00""#).is_err());
        assert!(read::<RequestTime>(r#""2026-01-01T00:00:00Z""#).is_ok());
        // Year 0, as a client once sent it.
        assert!(read::<RequestTime>(r#""0000-01-01T00:00:00Z""#).is_err());
        assert!(read::<RequestTime>(r#""1969-12-31T23:59:59Z""#).is_err());
        // The instant counts, whatever the offset.
        assert!(read::<RequestTime>(r#""1970-01-01T00:00:00+05:00""#).is_err());
        assert!(read::<RequestTime>(r#""9999-12-31T23:59:59-05:00""#).is_err());
        assert!(read::<RequestTime>(r#""1970-01-01T00:00:00-05:00""#).is_ok());
    }

    proptest::proptest! {
        /// The document's pattern for request times says exactly what the
        /// server accepts, at the edges of 1970 and 9999 with any offset.
        #[test]
        fn the_request_time_pattern_is_what_the_server_accepts(
            year in proptest::sample::select(vec![1969, 1970, 1971, 2026, 9998, 9999]),
            month in 1u32..=12,
            day in 1u32..=28,
            (hour, minute) in (0u32..24, 0u32..60),
            edge_day in proptest::bool::ANY,
            offset in proptest::option::of((proptest::bool::ANY, 0u32..24, 0u32..60)),
        ) {
            let pattern = regex::Regex::new(&request_time_pattern()).unwrap();
            // Often the first or last day of the year, where offsets matter.
            let (month, day) = match (edge_day, year) {
                (true, 1969..=1971) => (1, 1),
                (true, _) => (12, 31),
                _ => (month, day),
            };
            let offset = match offset {
                None => "Z".to_string(),
                Some((east, h, m)) => format!("{}{h:02}:{m:02}", if east { '+' } else { '-' }),
            };
            let text = format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:00{offset}");
            proptest::prop_assert_eq!(
                pattern.is_match(&text),
                RequestTime::parse(&text).is_ok(),
                "{}", text
            );
        }
    }

    #[test]
    fn an_object_only_struct_refuses_an_array() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Loose {
            #[serde(default)]
            n: Option<u8>,
        }
        assert!(
            read::<Loose>("[]").is_ok(),
            "serde's own reading takes an array"
        );
        assert!(
            read::<ObjectOnly<Loose>>("[]")
                .unwrap_err()
                .contains("invalid type")
        );
        assert_eq!(
            read::<ObjectOnly<Loose>>(r#"{"n": 2}"#).unwrap().0.n,
            Some(2)
        );
        assert!(read::<ObjectOnly<Loose>>(r#"{"m": 2}"#).is_err());
        let deserializer = &mut serde_json::Deserializer::from_str(r#"{"n": 300}"#);
        let error =
            serde_path_to_error::deserialize::<_, ObjectOnly<Loose>>(deserializer).unwrap_err();
        assert_eq!(error.path().to_string(), "n");
    }

    #[test]
    fn timestamps_leave_as_rfc3339() {
        assert_eq!(
            serde_json::to_value(Timestamp(0)).unwrap(),
            "1970-01-01T00:00:00+00:00"
        );
    }

    #[test]
    fn every_error_code_is_spelled_as_serde_spells_it() {
        for code in [
            ErrorCode::InvalidField,
            ErrorCode::MethodNotAllowed,
            ErrorCode::Internal,
        ] {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
    }
}
