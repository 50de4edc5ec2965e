//! `Secret<T>`: a value that cannot be displayed, debugged into the open or serialised, and
//! that is zeroed when dropped.

use std::fmt;

use zeroize::Zeroize;

/// A secret value. `Debug` prints `Secret(..)`; there is no `Display`, `Serialize` or `Clone`,
/// so it cannot end up in a log line, a metric, an error message or a config dump by accident.
/// The memory is zeroed on drop.
pub struct Secret<T: Zeroize>(T);

impl<T: Zeroize> Secret<T> {
    /// Wraps a value.
    pub fn new(value: T) -> Self {
        Self(value)
    }

    /// The value, for the one place that must use it (sealing, or writing it on the wire).
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T: Zeroize> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl<T: Zeroize> Drop for Secret<T> {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl<T: Zeroize> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new(b"ghp_canary_0123456789".to_vec());
        let shown = format!("{s:?} {:?}", Some(&s));
        assert!(!shown.contains("canary"), "{shown}");
        assert_eq!(shown, "Secret(..) Some(Secret(..))");
        assert_eq!(s.expose(), b"ghp_canary_0123456789");
    }
}
