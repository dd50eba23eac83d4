// SCAFFOLD (to be replaced by the rope family).
int main() { return 0; }
