//! `multigrain`: command-line front end of the multigrain DSM system.
fn main() {}
