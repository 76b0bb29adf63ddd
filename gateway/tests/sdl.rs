//! The committed SDL (`schema/graphql/schema.graphql`) is the schema the gateway serves.
//! After changing the schema, regenerate it with
//! `LEASEHOLD_UPDATE_SDL=1 cargo test -p leasehold-gateway --test sdl`.

#[test]
fn the_committed_sdl_matches_the_schema() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../schema/graphql/schema.graphql");
    let sdl = leasehold_gateway::sdl();
    if std::env::var_os("LEASEHOLD_UPDATE_SDL").is_some() {
        std::fs::write(path, &sdl).expect("the SDL file is writable");
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == sdl,
        "schema/graphql/schema.graphql is out of date; regenerate it with \
         LEASEHOLD_UPDATE_SDL=1 cargo test -p leasehold-gateway --test sdl"
    );
}
