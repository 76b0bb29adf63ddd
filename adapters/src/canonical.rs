//! RFC 8785 (JSON Canonicalization Scheme) serialisation of `serde_json` values.
//!
//! The hash chain hashes canonical JSON so that a verifier, in any language, can recompute a
//! hash from what it reads back: object keys sorted by their UTF-16 code units, no
//! whitespace, strings escaped as ECMAScript's `JSON.stringify` does, and numbers printed as
//! ECMAScript prints an IEEE double.

use std::fmt::Write as _;

use serde_json::Value;

/// The RFC 8785 form of `value`.
pub fn to_canonical_json(value: &Value) -> String {
    // Room for a typical event payload, so that the text is not regrown as it is written.
    let mut out = String::with_capacity(512);
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => write_number(out, number),
        Value::String(text) => write_string(out, text),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            // Keys usually come sorted already (serde_json's map keeps byte order, which is
            // UTF-16 order for all but a few code points): then no list is built and sorted.
            let sorted = map.keys().zip(map.keys().skip(1)).all(|(a, b)| utf16_le(a, b));
            if sorted {
                write_entries(out, map.iter());
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
                write_entries(out, entries.into_iter());
            }
            out.push('}');
        }
    }
}

/// Whether `a` sorts before (or as) `b` by UTF-16 code units.
fn utf16_le(a: &str, b: &str) -> bool {
    if a.is_ascii() && b.is_ascii() {
        return a <= b;
    }
    a.encode_utf16().cmp(b.encode_utf16()).is_le()
}

fn write_entries<'a>(out: &mut String, entries: impl Iterator<Item = (&'a String, &'a Value)>) {
    for (index, (key, item)) in entries.enumerate() {
        if index > 0 {
            out.push(',');
        }
        write_string(out, key);
        out.push(':');
        write_value(out, item);
    }
}

/// Numbers are IEEE doubles in RFC 8785: integers beyond 2^53 lose precision exactly as
/// they would in a JavaScript verifier.
fn write_number(out: &mut String, number: &serde_json::Number) {
    // An integer a double holds exactly prints as its digits, as ECMAScript prints it; the
    // double formatter is needed only for fractions and for larger integers (which round).
    const EXACT: u64 = 1 << 53;
    if let Some(integer) = number.as_i64().filter(|n| n.unsigned_abs() <= EXACT) {
        write_integer(out, integer);
        return;
    }
    let double = number.as_f64().unwrap_or(f64::NAN);
    if !double.is_finite() {
        // serde_json cannot hold NaN or infinities; this is unreachable for parsed JSON.
        out.push_str("null");
        return;
    }
    if double == 0.0 {
        // Negative zero prints as 0.
        out.push('0');
        return;
    }
    let mut buffer = ryu_js::Buffer::new();
    out.push_str(buffer.format_finite(double));
}

/// Appends an integer's decimal digits (without the formatting machinery, which costs more
/// than the digits for the small integers payloads mostly hold).
fn write_integer(out: &mut String, integer: i64) {
    if integer < 0 {
        out.push('-');
    }
    let mut magnitude = integer.unsigned_abs();
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    out.push_str(std::str::from_utf8(&digits[start..]).unwrap_or_default());
}

/// Appends `text` as an RFC 8785 JSON string.
pub fn write_string(out: &mut String, text: &str) {
    out.push('"');
    // Most strings need no escape: one pass without early exit (which the compiler can
    // vectorise) finds out, and such a string is copied whole.
    let needs_escape = text
        .bytes()
        .fold(false, |any, byte| any | (byte < 0x20) | (byte == b'"') | (byte == b'\\'));
    if !needs_escape {
        out.push_str(text);
        out.push('"');
        return;
    }
    // Runs of characters that need no escape are copied whole.
    let mut run_start = 0;
    for (index, byte) in text.bytes().enumerate() {
        if byte >= 0x20 && byte != b'"' && byte != b'\\' {
            continue;
        }
        out.push_str(&text[run_start..index]);
        match byte {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x08 => out.push_str("\\b"),
            0x09 => out.push_str("\\t"),
            0x0A => out.push_str("\\n"),
            0x0C => out.push_str("\\f"),
            0x0D => out.push_str("\\r"),
            control => {
                let _ = write!(out, "\\u{control:04x}");
            }
        }
        run_start = index + 1;
    }
    out.push_str(&text[run_start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        let value = json!({"b": [1, {"z": null, "a": true}], "a": "x"});
        assert_eq!(to_canonical_json(&value), r#"{"a":"x","b":[1,{"a":true,"z":null}]}"#);
    }

    #[test]
    fn sorts_keys_by_utf16_code_units() {
        // U+1F600 is a surrogate pair starting 0xD83D, which sorts before U+FB01 (0xFB01),
        // although its UTF-8 bytes sort after.
        let value = json!({"\u{fb01}": 1, "\u{1f600}": 2, "a": 3});
        assert_eq!(to_canonical_json(&value), "{\"a\":3,\"\u{1f600}\":2,\"\u{fb01}\":1}");
    }

    #[test]
    fn prints_numbers_as_ecmascript() {
        // Examples from RFC 8785 appendix B.
        let cases = [
            ("0", "0"),
            ("-0.0", "0"),
            ("1.0", "1"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("333333333.3333333", "333333333.3333333"),
            ("9007199254740993", "9007199254740992"),
            ("4.50", "4.5"),
            ("-1.5e-3", "-0.0015"),
            ("-7", "-7"),
            ("1234567890123", "1234567890123"),
            ("-9007199254740992", "-9007199254740992"),
            ("9007199254740992", "9007199254740992"),
            ("-9007199254740993", "-9007199254740992"),
            ("18446744073709551615", "18446744073709552000"),
        ];
        for (input, expected) in cases {
            let value: Value = serde_json::from_str(input).unwrap();
            assert_eq!(to_canonical_json(&value), expected, "for {input}");
        }
    }

    #[test]
    fn escapes_strings_as_json_stringify() {
        let value = json!("a\"b\\c\u{1}\u{1f}\n\t/\u{7f}\u{2028}é");
        assert_eq!(
            to_canonical_json(&value),
            "\"a\\\"b\\\\c\\u0001\\u001f\\n\\t/\u{7f}\u{2028}é\""
        );
    }

    #[test]
    fn reparsing_the_canonical_form_is_a_fixed_point() {
        let value = json!({"n": [1.5, -2, 1e300, 12345678901234567890u64], "s": "ü\u{0}"});
        let once = to_canonical_json(&value);
        let again = to_canonical_json(&serde_json::from_str(&once).unwrap());
        assert_eq!(once, again);
    }
}
