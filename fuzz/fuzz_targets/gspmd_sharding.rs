//! GSPMD sharding strings: parse or fail cleanly; a valid tiling gives every
//! partition a coordinate inside the tile grid.
#![no_main]
use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use tessel::program::mlir::ShardingAnnotation;
use tessel::program::sharding::Tiling;

fuzz_target!(|input: (u8, u8, &str)| {
    let (rank, partitions, text) = input;
    let (rank, partitions) = (rank as usize % 5, partitions as usize % 17 + 1);
    let ann = ShardingAnnotation::Gspmd(text.to_owned());
    if let Ok(t) = Tiling::from_annotation(Some(&ann), rank, partitions, &BTreeMap::new()) {
        assert_eq!(t.tiles.len(), rank);
        assert_eq!(t.coords.len(), partitions);
        for c in &t.coords {
            assert!(c.iter().zip(&t.tiles).all(|(x, n)| x < n));
        }
    }
});
