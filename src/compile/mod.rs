//! stub
/// stub
pub fn worker_main() -> Result<(), crate::worker::ServeError> { Ok(()) }
