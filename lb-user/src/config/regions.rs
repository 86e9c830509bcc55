//! The built-in region hierarchy of GEOGRAPHIC routing (spec §2.4): state/province -> country
//! -> GEO-xx group -> WORLD, loaded from `data/regions.txt` (embedded at build time).

use std::collections::HashMap;
use std::sync::OnceLock;

const REGIONS_TXT: &str = include_str!("../../data/regions.txt");

/// The root of the hierarchy.
pub const WORLD: &str = "WORLD";

/// Region codes with their parent and display name.
#[derive(Debug)]
pub struct RegionTree {
    /// code -> (parent code, name); the root has no parent.
    regions: HashMap<String, (Option<String>, String)>,
}

impl RegionTree {
    /// The embedded hierarchy. The data file is part of the build, so a malformed file is a
    /// programming error caught by the unit test below, not a user error.
    pub fn builtin() -> &'static RegionTree {
        static TREE: OnceLock<RegionTree> = OnceLock::new();
        TREE.get_or_init(|| RegionTree::parse(REGIONS_TXT).expect("data/regions.txt is valid"))
    }

    /// Parses `CODE PARENT NAME...` lines (`#` comments, parent `-` for the root). Every parent
    /// must be defined on an earlier line, which rules out loops.
    pub fn parse(text: &str) -> Result<RegionTree, String> {
        let mut regions: HashMap<String, (Option<String>, String)> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.splitn(3, ' ');
            let (Some(code), Some(parent), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("line {}: expected CODE PARENT NAME", n + 1));
            };
            let parent = match parent {
                "-" => None,
                p if regions.contains_key(p) => Some(p.to_string()),
                p => return Err(format!("line {}: parent {p} is not defined above", n + 1)),
            };
            if regions.insert(code.to_string(), (parent, name.trim().to_string())).is_some() {
                return Err(format!("line {}: duplicate code {code}", n + 1));
            }
        }
        Ok(RegionTree { regions })
    }

    pub fn contains(&self, code: &str) -> bool {
        self.regions.contains_key(code)
    }

    pub fn name(&self, code: &str) -> Option<&str> {
        self.regions.get(code).map(|(_, n)| n.as_str())
    }

    pub fn parent(&self, code: &str) -> Option<&str> {
        self.regions.get(code)?.0.as_deref()
    }

    /// `code` and its ancestors, most specific first (e.g. US-CA, US, GEO-NA, WORLD). Empty for
    /// an unknown code.
    pub fn ancestors_inclusive<'a>(&'a self, code: &'a str) -> Vec<&'a str> {
        let mut chain = Vec::new();
        let mut current = self.regions.get_key_value(code).map(|(k, _)| k.as_str());
        while let Some(c) = current {
            chain.push(c);
            current = self.parent(c);
        }
        chain
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_hierarchy_is_complete() {
        let t = RegionTree::builtin();
        assert!(t.len() > 300);
        assert_eq!(t.ancestors_inclusive("US-CA"), ["US-CA", "US", "GEO-NA", WORLD]);
        assert_eq!(t.ancestors_inclusive("IE"), ["IE", "GEO-EU", WORLD]);
        assert_eq!(t.ancestors_inclusive("GB-SCT"), ["GB-SCT", "GB", "GEO-EU", WORLD]);
        assert_eq!(t.ancestors_inclusive("AU-NSW"), ["AU-NSW", "AU", "GEO-AP", WORLD]);
        assert_eq!(t.ancestors_inclusive("CA-QC"), ["CA-QC", "CA", "GEO-NA", WORLD]);
        assert_eq!(t.ancestors_inclusive("AE"), ["AE", "GEO-ME", WORLD]);
        assert!(t.ancestors_inclusive("XX").is_empty());
        for g in ["GEO-EU", "GEO-ME", "GEO-NA", "GEO-AS", "GEO-AF", "GEO-AN", "GEO-SA", "GEO-AP"] {
            assert_eq!(t.parent(g), Some(WORLD), "{g}");
        }
        // Every code reaches WORLD.
        for code in t.regions.keys() {
            assert_eq!(t.ancestors_inclusive(code).last(), Some(&WORLD), "{code}");
        }
    }

    #[test]
    fn malformed_files_are_rejected() {
        assert!(RegionTree::parse("A B x").is_err());
        assert!(RegionTree::parse("A - x\nA - y").is_err());
        assert!(RegionTree::parse("A -").is_err());
    }
}
