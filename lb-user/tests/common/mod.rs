//! TOML builders shared by the Traffic Manager test suites.
#![allow(dead_code)]

/// One `[[service.backend]]` table: `name`, `address` (empty = nested) and extra keys.
pub fn ep(name: &str, address: &str, extra: &str) -> String {
    let addr = if address.is_empty() { String::new() } else { format!("address = \"{address}\"\n") };
    format!("\n[[service.backend]]\nname = \"{name}\"\n{addr}{extra}\n")
}

/// One `[[service]]` with the given routing method, keys and endpoints; a distinct VIP per name.
pub fn service(name: &str, method: &str, keys: &str, endpoints: &[String]) -> String {
    let n = name.bytes().map(u32::from).sum::<u32>() % 250 + 1;
    format!(
        "\n[[service]]\nname = \"{name}\"\nvip = \"198.51.100.{n}\"\nprotocol = \"TCP\"\n\
         ports = [80]\nrouting_method = \"{method}\"\n{keys}\n{}",
        endpoints.concat()
    )
}
