//! Dates in UTC for report headers and JSON files, from the system clock with Howard Hinnant's
//! civil-from-days (so no date crate is needed).

/// A UTC calendar time, to the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UtcTime {
    /// Year (proleptic Gregorian).
    pub year: i64,
    /// Month, 1 to 12.
    pub month: i64,
    /// Day of the month, 1 to 31.
    pub day: i64,
    /// Hour, 0 to 23.
    pub hour: i64,
    /// Minute, 0 to 59.
    pub minute: i64,
    /// Second, 0 to 59.
    pub second: i64,
}

impl UtcTime {
    /// The calendar time `secs` seconds after the Unix epoch.
    pub fn from_unix(secs: i64) -> UtcTime {
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        // Howard Hinnant's days_from_civil, inverted.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        UtcTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
        }
    }

    /// Now, from the system clock (the epoch if the clock is before it).
    pub fn now() -> UtcTime {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()) as i64;
        UtcTime::from_unix(secs)
    }

    /// `YYYY-MM-DD`.
    pub fn date(&self) -> String {
        format!("{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }

    /// `YYYY-MM-DD HH:MM UTC`, as report headers show it.
    pub fn minute(&self) -> String {
        format!("{} {:02}:{:02} UTC", self.date(), self.hour, self.minute)
    }

    /// `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339), as JSON files record it.
    pub fn rfc3339(&self) -> String {
        format!(
            "{}T{:02}:{:02}:{:02}Z",
            self.date(),
            self.hour,
            self.minute,
            self.second
        )
    }
}

/// Today's UTC date, `YYYY-MM-DD`.
pub fn utc_date() -> String {
    UtcTime::now().date()
}

/// Now, `YYYY-MM-DD HH:MM UTC`.
pub fn utc_minute() -> String {
    UtcTime::now().minute()
}

/// Now, `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_rfc3339() -> String {
    UtcTime::now().rfc3339()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(UtcTime::from_unix(0).rfc3339(), "1970-01-01T00:00:00Z");
        // 2000-02-29 (a leap day) 12:34:56.
        assert_eq!(
            UtcTime::from_unix(951_827_696).rfc3339(),
            "2000-02-29T12:34:56Z"
        );
        assert_eq!(
            UtcTime::from_unix(1_764_547_200).minute(),
            "2025-12-01 00:00 UTC"
        );
        assert_eq!(UtcTime::from_unix(-1).date(), "1969-12-31");
    }
}
