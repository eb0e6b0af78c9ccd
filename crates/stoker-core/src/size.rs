//! Human byte sizes: `8MiB`, `512k`, `1.5G`, `1048576`. Binary units throughout (`k` = 1024),
//! because buffer and cache sizes are always thought of in powers of two.

use std::fmt;

/// A byte count that parses from and prints as a human size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// Why a size string did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid byte size {input:?}: {reason} (examples: 1048576, 512KiB, 8MiB, 1.5G)")]
pub struct ParseSizeError {
    input: String,
    reason: &'static str,
}

impl ByteSize {
    /// The number of bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl std::str::FromStr for ByteSize {
    type Err = ParseSizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseSizeError {
            input: s.to_string(),
            reason,
        };
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(err("no number"));
        }
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            _ => return Err(err("unknown unit")),
        };
        if let Ok(n) = num.parse::<u64>() {
            return n
                .checked_mul(mult)
                .map(ByteSize)
                .ok_or_else(|| err("too large"));
        }
        let f: f64 = num.parse().map_err(|_| err("bad number"))?;
        let v = f * mult as f64;
        if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
            return Err(err("too large"));
        }
        Ok(ByteSize(v.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut i = 0;
        while v >= 1024.0 && i + 1 < UNITS.len() {
            v /= 1024.0;
            i += 1;
        }
        if i == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[i])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ByteSize;

    #[test]
    fn parses_units() {
        let p = |s: &str| s.parse::<ByteSize>().unwrap().0;
        assert_eq!(p("123"), 123);
        assert_eq!(p("8MiB"), 8 << 20);
        assert_eq!(p("8m"), 8 << 20);
        assert_eq!(p("512 KiB"), 512 << 10);
        assert_eq!(p("1.5G"), 3 << 29);
        assert!("".parse::<ByteSize>().is_err());
        assert!("12 parsecs".parse::<ByteSize>().is_err());
    }

    #[test]
    fn displays() {
        assert_eq!(ByteSize(10).to_string(), "10 B");
        assert_eq!(ByteSize(8 << 20).to_string(), "8.0 MiB");
    }
}
