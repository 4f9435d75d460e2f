progenitor::generate_api!("openapi.json");
fn main() {}
