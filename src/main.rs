fn main() {
    println!("mixprec {}", env!("CARGO_PKG_VERSION"));
}
